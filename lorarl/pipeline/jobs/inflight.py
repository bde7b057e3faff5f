"""A lost launcher's job, found again; and the outputs, not the scheduler, decide success.

When the submit host dies (Snakemake and every `lorarl launch` killed) the jobs keep running: Slurm
jobs on the cluster, local jobs as orphaned processes. A restarted `snakemake all` runs `lorarl launch`
again for each unfinished stage; before submitting, `find_job` looks for the stage's job still in
flight, and the launcher waits on that one instead of submitting a duplicate:
* Slurm: `squeue` for the job name of this stage and cell (`lorarl-<stage>-<study>-<cell>`, unique per
  stage key) or the job id recorded in the stage's provenance file: any job not yet finished;
* local: a live `submitit.local._local` process whose command line names this stage's log folder
  (its pid is the job id).
Found by name, not only by the recorded id: a launcher killed between the submission and writing
the id down still has its job found.

After the job ends, `missing_outputs` checks the stage's declared outputs: a job that Slurm or
submitit reports as a success (or whose state is UNKNOWN, or unavailable) without its outputs is a
failure. The outputs decide. When sacct cannot answer (slurmdbd down, accounting storage unreachable:
every state reads UNKNOWN), `slurm.controller_state` asks slurmctld itself whether the job has ended.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lorarl.io import pid_alive
from lorarl import provenance
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.pipeline.jobs.slurm import squeue_rows
from lorarl.pipeline.jobs.stages import get_stage

DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
               "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"}


def slurm_job_in_flight(name: str, recorded_id: str | None) -> tuple[str, str] | None:
    """(job id, state) of an unfinished Slurm job of this stage: by name, else by the recorded id."""
    rows = squeue_rows(["--name", name]) or []
    if recorded_id:
        rows += [r for r in (squeue_rows(["-j", recorded_id]) or []) if r[2] == name]
    for jid, state, _ in rows:
        if state and state.split()[0] not in DONE_STATES:
            return jid.split("_")[0], state
    return None


def local_job_in_flight(folder: Path) -> str | None:
    """The pid of a live submitit local job running in this stage's log folder."""
    want = str(Path(folder).resolve())
    pids: list[tuple[int, str]] = []
    mine = _ancestors()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or d.name in mine:
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if want in args and ("submitit.local._local" in args or "submitit.core._submit" in args):
            pids.append((0 if "submitit.local._local" in args else 1, d.name))
    return min(pids)[1] if pids else None  # the controller (its pid is the job id), else an orphaned worker


def _ancestors() -> set[str]:
    """This process and its parents (never adopt ourselves)."""
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(str(pid))
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def find_job(executor: str, folder: Path, name: str, prov_file: Path) -> tuple[str, str] | None:
    """(job id, state) of this stage's job still in flight from an earlier launcher, or None."""
    subs = provenance.read(prov_file).get("submissions", [])
    recorded = str(subs[-1].get("job_id") or "") if subs else ""
    if executor == "slurm":
        return slurm_job_in_flight(name, recorded or None)
    if executor == "local":
        pid = local_job_in_flight(folder)
        return (pid, "RUNNING") if pid else None
    return None


def wait_local(pid: str, poll_s: float = 1.0) -> None:
    """An orphaned local job is not our child: wait for its pid to go."""
    while pid_alive(pid):
        time.sleep(poll_s)


def expected_outputs(stage: str, results_dir: str, study: str | None, cell: str,
                     params: JobParams = JobParams()) -> list[Path]:
    """The declared outputs of one stage of one cell (the stage registry's, lorarl.pipeline.jobs.stages; the Snakemake
    rules use the same paths); ``params``: the job's parameters (a rung job's ``until``, an evaluate job's
    ``eval_target``)."""
    return get_stage(stage).outputs(results_dir, study, cell, params)


def missing_outputs(stage: str, results_dir: str, study: str | None, cell: str,
                    config_hash: str | None = None, params: JobParams = JobParams()) -> list[str]:
    """What of the stage's outputs is absent or not this config's (empty: the stage is done)."""
    try:
        wanted = expected_outputs(stage, results_dir, study, cell, params)
    except Exception as err:  # noqa: BLE001 - an unparsable eval target: cannot confirm the outputs
        return [f"(cannot tell the outputs: {err})"]
    out = [str(p) for p in wanted if not p.exists()]
    if get_stage(stage).hashed_output and not out and config_hash:
        summary = wanted[0]  # summary.json, or the rung mark of a job stopped at a rung (lorarl.pipeline.jobs.rung_jobs)
        try:
            got = json.loads(summary.read_text()).get("config_hash")
        except (OSError, ValueError):
            got = None
        if got != config_hash:
            out.append(f"{summary} (config {got}, expected {config_hash})")
    return out
