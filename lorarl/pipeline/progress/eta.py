"""`lorarl status --watch`'s ETA: every job the study's run still has to execute, scheduled as Snakemake runs them.

The jobs left are :func:`lorarl.pipeline.doctor.jobs.planned_jobs` of the results as they are now (training,
evaluation per benchmark and snapshot step, diagnostics, aggregation, missing base models, packs). Each gets a
duration, first from this run's own finished jobs of its kind (provenance: from submission to the job's end; a
training job: its fixed part, the finished training jobs' duration less their steps, plus its cell's optimiser
updates at the measured step time), else from the doctor's projection (results/<study>/doctor/doctor.json: each
job's seconds on the doctor's machine at the profile's concurrency), else it is not counted and the ETA says it is a
lower bound. A running job costs what is left of it (training: its steps left; others: the expected duration less
the time since submission). The jobs are scheduled on the doctor's profile slots, or on as many as run now.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.io import pid_alive
from lorarl import provenance
from lorarl.pipeline.doctor.jobs import PlannedJob, from_rows, machine_rate, makespan, planned_jobs
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.pipeline.jobs.stages import STAGES, log_key, stage_of_record

TERMINAL = {"done", "diverged", "failed", "stale", "incomplete", "stopped"}  # stopped: censored at a rung


def _epoch(stamp: str | None) -> float | None:
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp() if stamp else None
    except ValueError:
        return None


def prov_file(results: Path, study: str, job: PlannedJob) -> Path | None:
    """The provenance file `lorarl launch` writes for this job (None: aggregation, which has none)."""
    s = job.stage  # its stage's facts: a study's or a model's, one folder per cell or per pack, a key per target
    if s is None:
        return None
    key = log_key(s.name, JobParams(**{s.key_param: job.target}) if s.key_param else JobParams())
    where = paths.pack_folder(job.cell) if s.members else (s.log_cell or job.cell)  # a pack's record: lorarl launch pack's
    return provenance.provenance_path(results, study if s.for_study else None, where, key)


def _last(path: Path | None) -> dict[str, Any]:
    """The last submission of a provenance file: submitted/started/ended epochs, job id, executor."""
    if path is None or not path.exists():
        return {}
    subs = provenance.read(path).get("submissions") or []
    if not subs:
        return {}
    s = subs[-1]
    a = (s.get("attempts") or [{}])[-1]
    return {"submitted": _epoch(s.get("submitted_at")), "started": _epoch(a.get("started_at")),
            "ended": _epoch(a.get("ended_at")), "ok": str(a.get("outcome", "")).startswith("completed"),
            "job": str(s.get("job_id") or ""), "executor": s.get("executor")}


def finished_durations(study: Any, results: Path) -> dict[str, list[tuple[str, float]]]:
    """kind -> [(cell, seconds from submission to the end)] of this study's finished jobs."""
    from lorarl.status import status_cells

    out: dict[str, list[tuple[str, float]]] = {}
    for c in status_cells(study, results):  # the seeds a hypothesis added included
        pdir = paths.cell_dir(results, study.name, c.id) / "provenance"
        for f in sorted(pdir.glob("*.json")) if pdir.is_dir() else []:
            kind = stage_of_record(f.stem)
            last = _last(f)
            if last.get("ok") and last.get("submitted") and last.get("ended"):
                out.setdefault(kind, []).append((c.id, last["ended"] - last["submitted"]))
    return out


def _doctor(results: Path, study: str) -> dict[str, Any]:
    try:
        return json.loads((Path(results) / study / "doctor" / "doctor.json").read_text()).get("projection") or {}
    except (OSError, json.JSONDecodeError):
        return {}


def study_eta(study: Any, results: str | Path, rows: list, step_s: float | None, now: float | None = None
              ) -> dict[str, Any]:
    """{eta_s, jobs_left (per kind), lower_bound, not_measured, sources, slots, running_jobs} for the jobs still to
    run. ``rows``: the cells' status (lorarl.status); ``step_s``: the measured seconds per optimiser
    update (None: not yet)."""
    from lorarl.language.kinds import get_kind
    from lorarl.status import status_cells

    results, now = Path(results), time.time() if now is None else now
    batch = get_kind(study.kind).batch_stage
    if batch:  # one job runs every cell (the toy study): the doctor plans no per-cell job to time
        unfinished = any(r.kind == "cell" and r.train.state not in TERMINAL for r in rows)
        return {"eta_s": None if unfinished else 0.0, "jobs_left": {batch: 1} if unfinished else {},
                "lower_bound": unfinished, "not_measured": [batch] if unfinished else [], "sources": [],
                "slots": 1, "running_jobs": 0}
    doc = _doctor(results, study.name)
    jobs = planned_jobs(study, results, doc.get("pack_max_cells", 1), doc.get("pack_places", 0))  # the doctor's plan
    failed = {j.key for j in jobs if j.timing.of_cell and any(
        r.cell == j.cell and r.kind == "cell" and r.train.state == "failed" for r in rows)}
    for j in jobs:  # a failed cell is not retried in this run: nor are the jobs that need it
        if any(a in failed for a in j.after) and not j.timing.keeps_going:
            failed.add(j.key)
    jobs = [j for j in jobs if j.key not in failed]
    keep = {j.key for j in jobs}
    jobs = [PlannedJob(j.kind, j.cell, j.target, tuple(a for a in j.after if a in keep), j.base, j.holds)
            if j.timing.keeps_going else j for j in jobs]
    units = get_kind(study.kind).updates
    updates = {c.id: units(c.config)[1] for c in status_cells(study, results)}
    done_steps = {r.cell: int(r.train.step.split("/")[0]) for r in rows
                  if r.kind == "cell" and r.train.step.split("/")[0].isdigit()}
    seen = finished_durations(study, results)
    fixed = [d - updates[c] * step_s for k, v in seen.items() if k in STAGES and STAGES[k].timing.by_steps
             for c, d in v if step_s is not None and c in updates]  # by-steps jobs' start-up: duration less steps
    mean = {k: sum(d for _, d in v) / len(v) for k, v in seen.items() if v}
    doctor_jobs, doctor_cost = from_rows(doc["schedule"]) if doc.get("schedule") else ([], {})
    slots = int(doc.get("concurrent_jobs") or 0)
    rate = machine_rate(doc.get("load")) if doc.get("shared_machine") else None
    doctor_secs = {}  # each doctor-projected job's seconds at the profile's full concurrency
    for j in doctor_jobs:
        cpu, wait = doctor_cost[j.key]
        doctor_secs[j.key] = cpu / (rate(slots) if rate else 1.0) + wait
    cost: dict[str, float] = {}
    missing: set[str] = set()
    running: dict[str, float] = {}
    sources: set[str] = set()
    for j in jobs:
        last = _last(prov_file(results, study.name, j))
        alive = bool(last.get("submitted")) and not last.get("ended") and (
            last.get("executor") == "slurm" or pid_alive(last.get("job") or 0))
        if j.timing.by_steps and step_s is not None and (fixed or j.key in doctor_secs):
            steps_left = max(updates[j.cell] - done_steps.get(j.cell, 0), 0) * step_s
            start = sum(fixed) / len(fixed) if fixed else doctor_secs[j.key] - updates[j.cell] * step_s
            secs = steps_left + (0.0 if alive and done_steps.get(j.cell) else max(start, 0.0))
            sources.add("this run" if fixed else "the doctor")
        elif j.kind in mean and j.timing.mean_timed:
            secs = mean[j.kind]
            sources.add("this run")
        elif j.key in doctor_secs:
            secs = doctor_secs[j.key]
            sources.add("the doctor")
        elif j.timing.by_steps and step_s is not None:
            secs = max(updates[j.cell] - done_steps.get(j.cell, 0), 0) * step_s  # steps only: a lower bound
            missing.add("train start-up")
        else:
            secs = 0.0
            missing.add(j.kind)
        if alive:
            if not j.timing.by_steps:
                secs = max(secs - (now - last["submitted"]), 0.0)
            running[j.key] = 0.0
        cost[j.key] = secs
    if not slots:
        slots = max(1, len(running))
    eta = makespan(jobs, lambda j: (0.0, cost[j.key]), slots, None, started=running,
                   count_threads=bool(doc.get("shared_machine", True))) if jobs else 0.0
    left: dict[str, int] = {}
    for j in jobs:
        left[j.kind] = left.get(j.kind, 0) + 1
    return {"eta_s": eta, "jobs_left": left, "lower_bound": bool(missing), "not_measured": sorted(missing),
            "sources": sorted(sources), "slots": slots, "running_jobs": len(running)}
