"""`lorarl status <study> --watch`: a compact view that stays readable at 1,000 cells, redrawn until
the study ends (every cell done, diverged or failed, nothing running or queued).

    demo  12:03:41  8 cells: 3 done, 2 running, 0 failed, 3 not started   [#######.........] 41%
    running: r8-kl0-s0 61/80, r8-kl0-s1 12/80
    failed:  (none)        flags: r1-kl0-s1 reward_collapse@44
    ETA 4m50s (17 jobs: 5 train, 6 eval, 5 diag, 1 agg; step 0.41s from 3 cells; times: this run; 2 at once)

The ETA counts every job the run still executes (lorarl.pipeline.progress.eta): training (the running cells' steps left
and the unstarted cells' start-up + steps, at the mean measured step time: finished cells' summary.json, else the
running cells' metrics so far), each evaluation, diagnostics, the aggregation and missing base models, with
durations measured on this run's finished jobs (else the doctor's projection), scheduled on the slots the run
uses. A kind of job with no measurement yet is left out and the ETA reads ">=".
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from lorarl import paths

SHOW = 8  # names listed per line before "+N more"
SHORT = {"evaluate": "eval", "diagnose": "diag", "aggregate": "agg", "train start-up": "train start"}  # ETA line


def _names(items: list[str]) -> str:
    if not items:
        return "(none)"
    more = f" +{len(items) - SHOW} more" if len(items) > SHOW else ""
    return ", ".join(items[:SHOW]) + more


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def _running_step_time(results: Path, study: str, cell: str) -> list[float]:
    p = paths.cell_dir(results, study, cell) / ".train.tmp" / "metrics.csv"
    try:
        with open(p, newline="") as fh:
            return [float(r["step_time_s"]) for r in csv.DictReader(fh) if r.get("step_time_s")]
    except (FileNotFoundError, ValueError, KeyError):
        return []


def _flag_summary(rows) -> list[str]:
    """Per flag: how many cells, and the earliest one (`adv_std_spike 9 cells, first process-r1-s0@15`)."""
    by: dict[str, list[tuple[int, str]]] = {}
    for r in rows:
        for k, v in r.flags.items():
            by.setdefault(k, []).append((int(v), r.cell))
    return [f"{k} {len(v)} cell{'s' if len(v) > 1 else ''} (first {min(v)[1]}@{min(v)[0]})" for k, v in by.items()]


def snapshot(study_path: str, results: str | Path = "results") -> dict:
    """Counts, running cells with their step, failures, flags and the ETA, from `lorarl.status`."""
    from lorarl.build_progress import base_lines
    from lorarl.models import study_recipes
    from lorarl.status import status_cells, study_status
    from lorarl.language.kinds import get_kind
    from lorarl.language.study import load_study

    study = load_study(study_path)
    results = Path(results)
    cells = status_cells(study, results)  # the seeds a hypothesis added included, as in `lorarl status`
    # progress counts optimiser updates (TRL's global step); step times are per training step
    units = get_kind(study.kind).updates  # a toy cell is one unit: it has no optimiser steps
    per = {c.id: units(c.config)[0] for c in cells}
    steps = {c.id: units(c.config)[1] for c in cells}
    rows = [r for r in study_status(study_path, results) if r.kind == "cell"]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.train.state] = counts.get(r.train.state, 0) + 1
    running = [r for r in rows if r.train.state in ("running", "queued", "interrupted")]
    times, n_times = [], 0
    for r in rows:
        if r.train.state in ("done", "diverged"):
            try:
                t = json.loads(paths.path("summary", results=results, study=study.name, cell=r.cell).read_text())
                times.append(float(t["mean_step_time_s"]) / per[r.cell])  # per optimiser update
                n_times += 1
            except (FileNotFoundError, KeyError, ValueError, json.JSONDecodeError):
                pass
    source = f"from {n_times} cells"
    if not times:
        for r in running:
            times += [s / per[r.cell] for s in _running_step_time(results, study.name, r.cell)]
        source = "from running cells"
    left = 0
    for r in rows:
        if r.train.state in ("running", "queued", "interrupted"):
            done_steps = int(r.train.step.split("/")[0]) if r.train.step.split("/")[0].isdigit() else 0
            left += max(steps[r.cell] - done_steps, 0)
        elif r.train.state == "not started":
            left += steps[r.cell]
    step_s = sum(times) / len(times) if times else None
    total = sum(steps.values())
    from lorarl.pipeline.progress.eta import TERMINAL, study_eta

    e = study_eta(study, results, rows, step_s)
    jobs = ", ".join(f"{n} {SHORT.get(k, k)}" for k, n in e["jobs_left"].items()) or "none"
    note = (f"{sum(e['jobs_left'].values())} jobs: {jobs}; "
            + (f"step {step_s:.2f}s {source}" if step_s else "no step measured yet")
            + (f"; times: {' + '.join(e['sources'])}" if e["sources"] else "")
            + (f"; untimed: {', '.join(SHORT.get(k, k) for k in e['not_measured'])}" if e["not_measured"] else "")
            + f"; {e['slots']} at once")
    return {
        "study": study.name, "n": len(rows), "counts": counts,
        "bases": base_lines(study_recipes(cells), results),  # local base models still building (lorarl.build_progress)
        "running": [f"{r.cell} {r.train.step or '?'}" for r in running],
        "failed": [f"{r.cell} ({r.train.detail[:60]})" if r.train.detail else r.cell
                   for r in rows if r.train.state == "failed"],
        "flags": _flag_summary(rows),
        "steps_left": left, "steps_total": total, "progress": 1 - left / total if total else 1.0,
        "eta_s": e["eta_s"] if step_s is not None or not e["lower_bound"] else None,
        "eta_lower_bound": e["lower_bound"], "jobs_left": e["jobs_left"], "eta_note": note,
        "ended": all(r.train.state in TERMINAL for r in rows),
    }


def render(s: dict, width: int = 24) -> str:
    c = s["counts"]
    main = ["done", "running", "failed", "diverged", "queued", "not started"]
    parts = [f"{c.get(k, 0)} {k}" for k in main if c.get(k) or k in ("done", "running", "failed")]
    parts += [f"{n} {k}" for k, n in sorted(c.items()) if k not in main]
    bar = "#" * int(round(width * s["progress"]))
    lines = [f"{s['study']}  {time.strftime('%H:%M:%S')}  {s['n']} cells: {', '.join(parts)}   "
             f"[{bar:.<{width}}] {100 * s['progress']:.0f}%",
             f"running: {_names(s['running'])}",
             f"failed:  {_names(s['failed'])}",
             f"flags:   {_names(s['flags'])}",
             ("ended" if s["ended"] else
              f"ETA {'>= ' if s.get('eta_lower_bound') else ''}{_fmt_s(s['eta_s'])} ({s['eta_note']})"
              if s["eta_s"] is not None else f"ETA ? ({s['eta_note']})")]
    return "\n".join(lines + s.get("bases", []))


def watch(study_path: str, results: str | Path = "results", interval: float = 5.0, max_updates: int | None = None,
          out: TextIO = sys.stdout) -> int:
    """Redraw until the study ends (or `max_updates` redraws); on a terminal the view is redrawn in place."""
    tty = out.isatty()
    n = 0
    while True:
        s = snapshot(study_path, results)
        text = render(s)
        out.write(("\x1b[H\x1b[2J" if tty else ("\n" if n else "")) + text + "\n")
        out.flush()
        n += 1
        if s["ended"] or (max_updates is not None and n >= max_updates):
            return 1 if s["counts"].get("failed") else 0
        time.sleep(interval)


def failure_lines(study_path: str, results: str | Path = "results") -> list[str]:
    """One line per failed stage of a study (Snakemake's `onerror`: the default profile hides the
    per-job error blocks, so the failures are listed here, with the reason and the log to read)."""
    from lorarl.status import study_status
    from lorarl.language.study import load_study

    name = load_study(study_path).name
    out = []
    for r in study_status(study_path, results):
        for stage, st in (("train", r.train), ("evaluate", r.evaluate)):
            if st.state == "failed":
                log = paths.cell_dir(results, name, r.cell) / "logs"
                out.append(f"FAILED {r.cell} {stage}: {st.detail[:160] or 'see log'} (logs: {log}/)")
    return out
