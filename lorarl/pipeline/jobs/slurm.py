"""Everything lorarl asks Slurm or tells submitit about Slurm: profile keys -> submitit parameters,
and the one place that calls `sacct`, `squeue` and `scontrol show job` (launcher, in-flight adoption,
doctor, status; slurmctld answers when accounting is down)."""

from __future__ import annotations

import re
import subprocess
import time
from typing import Any

# submitit's cluster-independent parameter names; any other profile key is a Slurm one (slurm_<key>)
GENERIC = {"timeout_min", "mem_gb", "nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "name",
           "stderr_to_stdout"}
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING",
          "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def coerce(value: Any) -> Any:
    """Snakemake hands a profile's nested `config:` values over as strings ("64", "True"): restore
    numbers and booleans (submitit computes with mem_gb, timeout_min, ...)."""
    if isinstance(value, dict):
        return {k: coerce(v) for k, v in value.items()}
    if isinstance(value, list):
        return [coerce(v) for v in value]
    if isinstance(value, str):
        if _INT.match(value):
            return int(value)
        if _FLOAT.match(value):
            return float(value)
        if value in ("True", "true", "False", "false"):
            return value in ("True", "true")
    return value


def slurm_parameters(slurm: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Profile keys → (AutoExecutor constructor kwargs, update_parameters kwargs)."""
    ctor: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for k, v in coerce(slurm or {}).items():
        if k == "setup" and isinstance(v, list):
            v = [str(line) for line in v]  # shell lines stay text
        if k == "max_num_timeout":  # how many time-limit requeues before giving up (submitit: 3)
            ctor["slurm_max_num_timeout"] = int(v)
        elif k in GENERIC or k.startswith("slurm_"):
            params[k] = v
        else:
            params[f"slurm_{k}"] = v
    return ctor, params


def squeue_rows(args: list[str]) -> list[tuple[str, str, str]] | None:
    """(job id, state, name) rows, or None when squeue cannot be asked."""
    try:
        proc = subprocess.run(["squeue", "-h", "-o", "%i|%T|%j", *args], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [tuple((line.split("|") + ["", "", ""])[:3]) for line in proc.stdout.splitlines() if line.strip()]


def sacct_info(job_id: str, fields: list[str] | None = None) -> dict[str, str]:
    """The final accounting record of a Slurm job (default: State, ExitCode, Reason, Elapsed, NodeList)."""
    fields = list(fields or ["JobID", "State", "ExitCode", "Reason", "Elapsed", "NodeList"])
    if "JobID" not in fields:
        fields.insert(0, "JobID")
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", ",".join(fields)],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]
    rows = [r for r in rows if r.get("JobID") == str(job_id)] or rows
    return rows[-1] if rows else {}


def squeue_state(job_id: str) -> str | None:
    """The job's state in the queue; None once it left the queue (or when squeue cannot be asked)."""
    rows = squeue_rows(["-j", str(job_id)])
    return rows[0][1] if rows else None


def controller_state(job_id: str) -> str | None:
    """The job's state as slurmctld holds it (`scontrol show job`), e.g. RUNNING or CANCELLED; "GONE" when
    the controller no longer knows the job (it ended more than MinJobAge ago); None when it cannot be asked."""
    try:
        proc = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return "GONE" if "Invalid job id" in proc.stderr + proc.stdout else None
    m = re.search(r"\bJobState=(\S+)", proc.stdout)
    return m.group(1) if m else None


def requeued(job: Any, label: str) -> bool:
    """A Slurm job that submitit sees ended (e.g. NODE_FAIL in sacct) without a result, but that Slurm
    requeued (slurmctld: PENDING again): True after a pause (keep waiting on it), else False."""
    if job.paths.result_pickle.exists():
        return False
    ctl = controller_state(job.job_id)
    if ctl is None or ctl.split()[0] not in ACTIVE:
        return False
    note = f"[lorarl] {label}: job {job.job_id} {job.state}, requeued by Slurm ({ctl}): waiting on it"
    if note not in _NOTED:
        _NOTED.add(note)
        print(note, flush=True)
    job.watcher.clear()  # forget submitit's cached final state: ask sacct again
    time.sleep(1.0)
    return True


_NOTED: set[str] = set()  # requeue notes already printed
