"""The cost ledger: what each job held (GPUs, else CPU cores) and for how long, by phase; one record per attempt.

A job's process keeps one clock (this module's state): the stage code adds the seconds of each phase where it
already measures them (`spent(phase, seconds)`, `phase(name)`), a trainer closes each step with `close_step(wall)`
(the step's time that no finer phase took is its update), a pack counts each member's completion tokens
(`count_tokens(cell, n)`), and the job's entry (lorarl.pipeline.jobs.launch.StageJob; `lorarl aggregate`) writes the
record at its end, also when it fails or is requeued:

    results/<study>/<cell>/cost/<key>-<job id>-<restart>-<pid>.json          (a cell's stage: train, evaluate-<target>, diagnose)
    results/<study>/.packs/<pack id>/cost/pack-....json                      (a pack or a resident job: its members' tokens)
    results/models/.logs/<name>/cost/base-....json                           (a base build)
    results/<study>/.aggregate/cost/aggregate-....json                       (the aggregate)

    {"schema": 1, "stage": "train", "key": "train", "study": ..., "cell": ..., "members": {cell: tokens} | null,
     "until": <rung step> | null, "job_id": "12" | null, "restart_count": 0, "host": ..., "outcome": "completed",
     "started_at": <epoch s>, "ended_at": <epoch s>, "wall_s": ..., "devices": {"gpus": 0, "cpus": 2,
     "source": "slurm" | "threads" | "affinity" | ...}, "phases_s": {"startup": ..., "generation": ..., ...},
     "idle_s": ..., "cpu_s": ..., "cpu_idle_share": ..., "steps": <step windows closed: a solo job's optimiser
     updates, a pack's steps>, "member_steps": {cell: steps} | null}

Wall time runs from the allocation's start (Slurm's start of the job; else the process's start: a submitit job's
process is the job; in-process (`debug`) from the entry's start) to the record. `startup` is the time from the
process's start to the job's first real work (lorarl.jobclock.first_work), less any phase timed before it; `other` is the rest of the stage's run after its first work that no phase timer
covers; `idle_s` is the wall time no phase accounts for (outside the stage's run: the scheduler's start of the
job's process, the executor's own start and end). A job in its own process rewrites its record at the process's
exit, adding the time since (`exit_s`: its threads joined, its result written) to the wall time and idle. `cpu_idle_share` is 1 - CPU seconds (this process and its waited-for children) / (cores x wall).
The roll-ups (tables/cost.csv, report.html, MLflow, `lorarl status`) read these files: lorarl.report.cost.
"""

from __future__ import annotations

import atexit
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

SCHEMA = 1
DIR = "cost"  # the records' folder beside a job's provenance

# The phases, in report order: what each one's seconds are (docs/report.md#cost-ledger).
PHASES: dict[str, str] = {
    "startup": "process start to the first real work: interpreter, imports, reading the study, model and engine loads",
    "load": "an evaluation's weights into its generation engine: model load, adapter merge, vLLM engine start, a "
            "snapshot's weights pushed",
    "generation": "sampling completions: training rollouts, an evaluation's generation",
    "reward": "rewards and grading of completions (an evaluation's grading too)",
    "reference": "the reference model's forward (the KL term)",
    "update": "the rest of a training step: old-policy and policy forwards, backward, optimiser (a base build's SFT)",
    "handoff": "pushing weights to a sampling engine; a pack's hand-off of its members' adapters",
    "checkpoint": "writing checkpoints and snapshots",
    "evaluation": "snapshot evaluation inside a training job",
    "diagnostics": "weight-space diagnostics",
    "wait": "waiting on a lock, a claim or a decision",
    "other": "the stage's run after its first work that no finer phase covers (logging, writing outputs, tables)",
    "scheduler": "a Slurm allocation held after its job's process ended (the step's and job's end): sacct's elapsed "
                 "less the record's wall time, added when the study is rolled up (lorarl.report.cost.scheduler_tails)",
}

class _Clock:
    """This process's ledger state; `begin` resets it (a job entry starts a fresh one)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.before_first = 0.0  # phase seconds spent before the first real work (not start-up)
        self.step_mark = 0.0  # phase seconds when the current step began
        self.steps = 0
        self.tokens: dict[str, float] = {}
        self.member_steps: dict[str, int] = {}
        self.origin = time.time()  # epoch of the allocation's start (the wall time's origin)
        self.origin_source = "entry"  # what said so: slurm | process | entry (a job run inside another process)
        self.proc_start = self.origin  # epoch of the job's process start (start-up counts from here)
        self.run_end: float | None = None  # epoch the stage's run returned
        self.first: float | None = None  # epoch of the first real work
        self.cpu0 = 0.0
        self.path: Path | None = None  # the record written at the job's end (rewritten at the process's exit)


_clock = _Clock()


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def slurm_start(env: dict[str, str] | None = None) -> float | None:
    """When Slurm started this job's current run (`scontrol show job`'s StartTime, whole seconds), or None."""
    env = os.environ if env is None else env
    jid = env.get("SLURM_JOB_ID")
    if not jid or shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", jid], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"\bStartTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", out)
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) if m else None
    except (OSError, subprocess.SubprocessError, ValueError, OverflowError):
        return None


def begin(in_process: bool, process_age_s: float | None = None) -> None:
    """A job's entry: a fresh clock from the allocation's start (Slurm's start of the job, else the process's, which
    started `process_age_s` ago (lorarl.jobclock.process_age_s); for a job run inside another process, from now).
    The time from the allocation's start to the process's is idle."""
    global _clock
    _clock = _Clock()
    age = None if in_process else process_age_s
    _clock.proc_start = time.time() - (age or 0.0)
    start = None if in_process else slurm_start()
    # Slurm's whole seconds: the allocation began in that second, at most a day before the process (else: not ours)
    ok = start is not None and _clock.proc_start - 86400 < start <= _clock.proc_start + 1
    _clock.origin = min(start, _clock.proc_start) if ok else _clock.proc_start
    _clock.origin_source = "slurm" if ok else ("entry" if in_process else "process")
    _clock.cpu0 = _cpu_s() if in_process else 0.0


def first_work() -> None:
    """Called by lorarl.jobclock.first_work the first time the job reaches real work: start-up ends here."""
    if _clock.first is None:
        _clock.first = time.time()


def spent(phase: str, seconds: float) -> None:
    """Add `seconds` of `phase` (one of PHASES) to this job's ledger."""
    if phase not in PHASES:
        raise ValueError(f"unknown ledger phase {phase!r}; allowed: {', '.join(PHASES)}")
    s = max(float(seconds), 0.0)
    _clock.phases[phase] = _clock.phases.get(phase, 0.0) + s
    if _clock.first is None:
        _clock.before_first += s


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as `name`."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        spent(name, time.perf_counter() - t0)


def total(name: str) -> float:
    """The seconds of phase `name` so far in this job (to take a nested phase out of an enclosing one)."""
    return _clock.phases.get(name, 0.0)


def step_begin() -> None:
    """A training step starts: the phases timed from here to `close_step` are inside it."""
    _clock.step_mark = sum(_clock.phases.values())


def close_step(wall_s: float) -> None:
    """A training step ended after `wall_s`: what its timed phases (since `step_begin`) did not take is update."""
    inside = sum(_clock.phases.values()) - _clock.step_mark
    spent("update", max(float(wall_s) - inside, 0.0))
    _clock.step_mark = sum(_clock.phases.values())
    _clock.steps += 1


def count_tokens(cell: str, tokens: float) -> None:
    """One step of a pack's member `cell`: its completion tokens (the key that splits the pack's time)."""
    _clock.tokens[cell] = _clock.tokens.get(cell, 0.0) + float(tokens)
    _clock.member_steps[cell] = _clock.member_steps.get(cell, 0) + 1


def run_ended() -> None:
    """The stage's run returned (or raised): the rest of the wall time is the executor's, not the stage's."""
    _clock.run_end = time.time()


def allocation(threads: int | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The devices this job holds: GPUs (Slurm's SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES, else torch's count)
    and CPU cores (Slurm's SLURM_CPUS_ON_NODE, else the job's threads as the launcher granted them, else this
    process's CPU affinity), each times the job's nodes on Slurm."""
    env = os.environ if env is None else env
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1) if env.get("SLURM_JOB_ID") else 1
    gpus, gsource = 0, "none"
    if env.get("SLURM_JOB_ID") and (env.get("SLURM_GPUS_ON_NODE") or "").isdigit():
        gpus, gsource = int(env["SLURM_GPUS_ON_NODE"]) * nodes, "slurm"
    elif env.get("CUDA_VISIBLE_DEVICES") not in (None, "", "-1", "NoDevFiles"):
        gpus, gsource = len([d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]), "CUDA_VISIBLE_DEVICES"
    elif "torch" in sys.modules:
        try:
            torch = sys.modules["torch"]
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            gsource = "torch" if gpus else "none"
        except Exception:  # noqa: BLE001 - the ledger must never fail a job
            gpus = 0
    if env.get("SLURM_JOB_ID") and (env.get("SLURM_CPUS_ON_NODE") or "").isdigit():
        cpus, csource = int(env["SLURM_CPUS_ON_NODE"]) * nodes, "slurm"
    elif threads:
        cpus, csource = int(threads), "threads"
    else:
        cpus, csource = len(os.sched_getaffinity(0)), "affinity"
    return {"gpus": gpus, "cpus": cpus, "gpu_source": gsource, "cpu_source": csource}


def record(stage: str, *, key: str | None = None, study: str | None, cell: str, outcome: str,
           threads: int | None = None, until: int | None = None, work: str = "other") -> dict[str, Any]:
    """This job's ledger record as it stands now (the entry writes it with `write`). ``work``: the phase the stage's
    run falls under where no finer timer took it (its registry entry's ``work``, lorarl.pipeline.jobs.stages)."""
    if work not in PHASES:
        raise ValueError(f"unknown ledger phase {work!r} for the work of stage {stage!r}; allowed: {', '.join(PHASES)}")
    now = time.time()
    c = _clock
    wall = max(now - c.origin, 0.0)
    phases = dict(c.phases)
    first = c.first if c.first is not None else (c.run_end or now)  # no first work: all of it was start-up
    phases["startup"] = phases.get("startup", 0.0) + max(first - max(c.proc_start, c.origin) - c.before_first, 0.0)
    if c.first is not None:
        run = max((c.run_end or now) - c.first, 0.0)
        named = sum(v for k, v in c.phases.items()) - c.before_first
        phases[work] = phases.get(work, 0.0) + max(run - named, 0.0)
    phases = {k: round(phases[k], 3) for k in PHASES if phases.get(k)}
    dev = allocation(threads)
    cpu = max(_cpu_s() - c.cpu0, 0.0)
    env = os.environ
    return {"schema": SCHEMA, "stage": stage, "key": key or stage, "study": study, "cell": cell,
            "members": {k: round(v, 1) for k, v in c.tokens.items()} or None,
            "member_steps": dict(c.member_steps) or None, "until": until, "steps": c.steps,
            "job_id": env.get("SLURM_JOB_ID"), "restart_count": int(env.get("SLURM_RESTART_COUNT") or 0),
            "host": socket.gethostname(), "pid": os.getpid(), "outcome": outcome[:500],
            "started_at": round(c.origin, 3), "started_by": c.origin_source, "ended_at": round(now, 3),
            "wall_s": round(wall, 3),
            "devices": dev, "phases_s": phases, "idle_s": round(max(wall - sum(phases.values()), 0.0), 3),
            "cpu_s": round(cpu, 3), "cpu_idle_share": round(max(1.0 - cpu / (dev["cpus"] * wall), 0.0), 4)
            if wall > 0 else None}


def cost_dir(provenance_file: str | Path) -> Path:
    """The ledger's folder beside a job's provenance record (a base build's `provenance.json`: its own folder)."""
    p = Path(provenance_file)
    return p.parent / DIR if p.name == "provenance.json" else p.parent.parent / DIR


def write(folder: str | Path, rec: dict[str, Any]) -> Path:
    """One small JSON per job attempt, written atomically."""
    from lorarl.io import write_json

    name = f"{rec['key']}-{rec['job_id'] or 'local'}-{rec['restart_count']}-{rec['pid']}.json"
    path = Path(folder) / name.replace("/", "_")
    write_json(path, rec, indent=1)
    return path


def write_safely(folder: str | Path, stage: str, **kw: Any) -> Path | None:
    """`write(record(...))`, never failing the job (a message on stderr instead)."""
    try:
        return write(folder, record(stage, **kw))
    except Exception as err:  # noqa: BLE001 - the ledger must never fail a job
        print(f"[lorarl] cost ledger: {type(err).__name__}: {err}", file=sys.stderr)
        return None


@contextmanager
def job(folder: str | Path | None, stage: str, *, in_process: bool, process_age_s: float | None,
        **kw: Any) -> Iterator[None]:
    """A job's whole run: a fresh clock (`begin`), and at the end, whatever the end, its record in `folder` (None:
    none) with its outcome: completed, failed (the exception), or interrupted (SystemExit: a requeue or a cancel)."""
    begin(in_process, process_age_s)
    if not in_process:  # registered first, so it runs last (atexit is LIFO): after the pools and threads the stage made
        atexit.register(_at_exit)
    outcome = "completed"
    try:
        yield
    except BaseException as err:
        outcome = ("interrupted (requeue, preemption or cancel)" if isinstance(err, SystemExit)
                   else f"failed: {type(err).__name__}: {err}")
        raise
    finally:
        run_ended()
        _clock.path = write_safely(folder, stage, outcome=outcome, **kw) if folder is not None else None


def _at_exit() -> None:
    """At the process's exit (its threads joined: MLflow's queued batches sent), the record again with the time since
    it was written added to its wall time and idle (`exit_s`): the allocation is held until the process ends."""
    import json

    path = _clock.path
    if path is None:
        return
    try:
        rec = json.loads(Path(path).read_text())
        now = time.time()
        extra = max(now - rec["ended_at"], 0.0)
        cpu = max(_cpu_s() - _clock.cpu0, 0.0)
        rec.update({"ended_at": round(now, 3), "wall_s": round(rec["wall_s"] + extra, 3), "exit_s": round(extra, 3),
                    "idle_s": round(rec["idle_s"] + extra, 3), "cpu_s": round(cpu, 3)})
        cores_wall = rec["devices"]["cpus"] * rec["wall_s"]
        rec["cpu_idle_share"] = round(max(1.0 - cpu / cores_wall, 0.0), 4) if cores_wall > 0 else None
        write(Path(path).parent, rec)
    except Exception as err:  # noqa: BLE001 - the ledger must never fail a job, not even at its exit
        print(f"[lorarl] cost ledger at exit: {type(err).__name__}: {err}", file=sys.stderr)
