"""`lorarl tracking serve --slurm`: the tracking server as a small Slurm job.

    lorarl tracking serve --slurm [--profile profiles/slurm] [--host 0.0.0.0] [--port 5000] [--state DIR]
                          [--partition cpu] [--time 7-0] [--cpus 2] [--mem 4G] [--sbatch "--account=x ..."]

Writes <state>/serve.sbatch (one step: `python -m lorarl.cli tracking serve ...` in the foreground) and
submits it with `sbatch --parsable`; then waits until the job has started the server, i.e. until
<state>/server.json names this job id and the URI in it answers /health, and prints the URI to put in
the profile (`tracking:`) and the job id (`scancel <id>` stops MLflow and PostgreSQL cleanly: SIGTERM).
If the job ends first, its Slurm state and the tail of its output are the error. The job binds to every
interface (0.0.0.0: cells on other nodes reach it), so MLflow's basic auth is on: the credentials file is
created here, mode 0600, before submitting (a shared home makes it the jobs' file too); the state folder
(PostgreSQL data, server.json) must be on a filesystem the submit host and the server's node share.
Resources: the profile's `slurm.tracking` mapping (partition, time or timeout_min, cpus_per_task, mem_gb,
account, qos, sbatch), then these flags.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lorarl.tracking.errors import TrackingError
from lorarl.tracking.credentials import credentials_path, write_credentials
from lorarl.tracking.server import wait_http

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")


def profile_resources(profile: str | Path | None) -> dict[str, Any]:
    """The `slurm.tracking` mapping of a profile's cluster.yaml/config.yaml ({} if none)."""
    import yaml

    out: dict[str, Any] = {}
    for name in ("config.yaml", "cluster.yaml"):
        f = Path(profile) / name if profile else None
        if f is not None and f.exists():
            doc = yaml.safe_load(f.read_text()) or {}
            found = ((doc.get("slurm") or {}).get("tracking") if isinstance(doc, dict) else None) or {}
            if not isinstance(found, dict):
                raise TrackingError(f"{f}: slurm.tracking must be a mapping (partition, time, cpus_per_task, "
                                    f"mem_gb, account, qos), not {found!r}")
            out.update(found)
    return out


def sbatch_script(serve_argv: list[str], state: Path, res: dict[str, Any]) -> str:
    lines = ["#!/bin/bash", "#SBATCH --job-name=lorarl-tracking", f"#SBATCH --output={state}/slurm-%j.out",
             "#SBATCH --nodes=1", "#SBATCH --ntasks=1"]
    flags = {"partition": "--partition", "time": "--time", "cpus_per_task": "--cpus-per-task", "account": "--account",
             "qos": "--qos"}
    for key, flag in flags.items():
        if res.get(key) not in (None, ""):
            lines.append(f"#SBATCH {flag}={res[key]}")
    if res.get("time") in (None, "") and res.get("timeout_min") not in (None, ""):
        lines.append(f"#SBATCH --time={int(res['timeout_min'])}")  # the stages' submitit spelling, minutes
    if res.get("mem_gb") not in (None, ""):
        lines.append(f"#SBATCH --mem={res['mem_gb']}G")
    for extra in shlex.split(str(res.get("sbatch") or "")):
        lines.append(f"#SBATCH {extra}")
    lines += [f"cd {shlex.quote(os.getcwd())}",
              "# SIGTERM (scancel) reaches this process: it stops MLflow, then PostgreSQL (a fast shutdown)",
              "exec " + " ".join(shlex.quote(a) for a in serve_argv), ""]
    return "\n".join(lines)


def _job_state(job_id: str) -> str:
    """PENDING/RUNNING/... from squeue, else from sacct (an ended job), else UNKNOWN."""
    q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    if q.returncode == 0 and q.stdout.strip():
        return q.stdout.split()[0]
    a = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
    return (a.stdout.split() or ["UNKNOWN"])[0] if a.returncode == 0 else "UNKNOWN"


def submit(host: str, port: int, state: str | Path, artifacts: str | Path, workers: int,
           credentials: str | Path | None, res: dict[str, Any], timeout_s: float = 600,
           backend: str | None = None) -> dict[str, Any]:
    """Submit the server job; wait for it to serve; return server.json's content (uri, slurm_job_id, ...)."""
    state, artifacts = Path(state).resolve(), Path(artifacts).resolve()
    state.mkdir(parents=True, exist_ok=True, mode=0o711 if os.geteuid() == 0 else 0o700)  # root: postgres traverses
    creds = credentials_path(credentials)
    write_credentials(creds)  # here, 0600, before the job exists: the job and every cell read this file
    argv = [sys.executable, "-m", "lorarl.cli", "tracking", "serve", "--host", host, "--port", str(port),
            "--state", str(state), "--artifacts", str(artifacts), "--workers", str(workers),
            "--credentials", str(creds)] + (["--backend-store-uri", backend] if backend else [])
    script = state / "serve.sbatch"
    script.write_text(sbatch_script(argv, state, res))
    info_file = state / "server.json"
    info_file.unlink(missing_ok=True)  # a stale one (an earlier server) must not be mistaken for this job's
    proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise TrackingError(f"sbatch {script} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    print(f"[lorarl] tracking server submitted as Slurm job {job_id} ({script}); waiting for it to serve",
          flush=True)
    deadline = time.monotonic() + timeout_s
    while True:
        if info_file.exists():
            info = json.loads(info_file.read_text())
            if str(info.get("slurm_job_id")) == job_id:
                wait_http(info["uri"], timeout_s=max(5.0, deadline - time.monotonic()))
                return info
        state_now = _job_state(job_id)
        if state_now.split()[0] in ENDED:
            out = state / f"slurm-{job_id}.out"
            tail = "\n".join(out.read_text(errors="replace").splitlines()[-20:]) if out.exists() else ""
            raise TrackingError(f"tracking server job {job_id} ended ({state_now}) before serving; {out}:\n{tail}")
        if time.monotonic() > deadline:
            raise TrackingError(f"tracking server job {job_id} ({state_now}) did not serve within {timeout_s:.0f} s; "
                                f"`scancel {job_id}` if it is no longer wanted")
        time.sleep(1.0)
