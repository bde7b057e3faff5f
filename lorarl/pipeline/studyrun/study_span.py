"""How long a study took and where its cells stand: what the study's MLflow parent run shows in the runs table.

The parent run spans the study: it starts when the study's first job did and ends when its aggregate
finished, and it carries that duration and its cell counts as metrics. Everything but the start
comes from the study's files, so `lorarl aggregate` and `lorarl sync-mlflow` (into any store) give the
parent the same span and the same numbers:
- start: the parent's start_time, set once when it is made: by the first cell job that opens the
  store (Tracker.study_run), i.e. the study's first job start. A parent made from the files
  (`sync-mlflow` into a new store, or an aggregate on a store that has none) starts at
  `first_start_ms`: the earliest job start the files record (provenance attempts' `started_at`,
  else a cell's summary.json time less its `wall_time_s`).
- end: `last_write_ms`: the newest of the aggregate's outputs (report.html, tables/, figures/) and the
  cells' summary.json and eval/*.json, so when the aggregate finished (or a cell that finished later).
- counts: the train states of `lorarl status` (lorarl.status): finished = done or diverged,
  failed = failed or incomplete (a job that ended without its outputs), diverged on its own too.
Each aggregate updates the same parent: its end time, and each metric whose value changed.

The parent's duration counts every gap between reruns, so beside it `study/last_run_wall_time_s` times the
study's last complete run: the newest `snakemake` invocation that submitted a job of the study (every job
submission records its invocation, the job's `--invocation` written by workflow/rules/common.smk; the aggregate
rule passes its own to `lorarl aggregate --invocation`), logged once every
cell has finished. It runs from the first start of that invocation's jobs (the parent's clock: a job's start,
not its time in a queue) to the end of the aggregate that ran in the same invocation (the end above). An
aggregate of another invocation (one that only re-aggregated), `lorarl aggregate` by hand and `sync-mlflow`
reuse `results/<study>/.last_run.json`, written by that aggregate; without it (Snakemake died before its
aggregate) the run ends at its last job's end.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from lorarl import paths
from lorarl.io import read_json, write_json
from lorarl.status import study_status
from lorarl.tracking.client import Tracker

WALL = "study/wall_time_s"
LAST = "study/last_run_wall_time_s"  # the study's last complete run (one `snakemake` invocation), no gaps
LAST_FILE = ".last_run.json"  # results/<study>/.last_run.json: that run, as its aggregate measured it
COUNTS = {"study/cells_finished": ("done", "diverged"), "study/cells_failed": ("failed", "incomplete"),
          "study/cells_diverged": ("diverged",)}
STAMP = "%Y-%m-%dT%H:%M:%S%z"  # lorarl.provenance.now()


def _cells(study: Any) -> list[Any]:
    from lorarl.language.study import base_cells, study_cells

    return list(study_cells(study)) + list(base_cells(study))


def _stamp_ms(value: Any) -> int | None:
    try:
        return int(datetime.strptime(str(value), STAMP).timestamp() * 1000)
    except ValueError:
        return None


def first_start_ms(study: Any, results_dir: str | Path) -> int | None:
    """The earliest job start of the study its files record (ms since the epoch), or None."""
    starts: list[int] = []
    for cell in _cells(study):
        cdir = paths.cell_dir(results_dir, study.name, cell.id)
        for prov in sorted((cdir / "provenance").glob("*.json")):
            try:
                doc = json.loads(prov.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            starts += [ms for sub in doc.get("submissions", []) for a in sub.get("attempts", [])
                       if (ms := _stamp_ms(a.get("started_at"))) is not None]
        summary = cdir / "summary.json"
        try:
            wall = float(json.loads(summary.read_text()).get("wall_time_s") or 0.0)
            starts.append(int((summary.stat().st_mtime - wall) * 1000))
        except (OSError, json.JSONDecodeError, TypeError, ValueError, AttributeError):
            pass
    return min(starts, default=None)


def last_write_ms(study: Any, results_dir: str | Path, outputs: Iterable[Path] = ()) -> int | None:
    """The newest write of the aggregate's `outputs` (files or folders) and the cells' results (ms), or None."""
    files: list[Path] = []
    for out in outputs:
        files += [f for f in Path(out).rglob("*") if f.is_file()] if Path(out).is_dir() else [Path(out)]
    for cell in _cells(study):
        cdir = paths.cell_dir(results_dir, study.name, cell.id)
        files += [cdir / "summary.json", *sorted((cdir / "eval").glob("*.json"))]
    times = [int(f.stat().st_mtime * 1000) for f in files if f.is_file()]
    return max(times, default=None)


def submissions(study: Any, results_dir: str | Path) -> list[dict]:
    """Every job submission the study's provenance records: its cells and base rows, packs, the toy batch job."""
    sdir = Path(results_dir) / study.name
    files = [f for cell in _cells(study) for f in sorted((sdir / cell.id / "provenance").glob("*.json"))]
    files += sorted(sdir.glob(f"{paths.pack_folder('*')}/provenance/*.json")) + sorted(sdir.glob(".toy/provenance/*.json"))
    out = []
    for f in files:
        doc = read_json(f)
        out += doc.get("submissions", []) if isinstance(doc, dict) else []
    return out


def last_run(study: Any, results_dir: str | Path, end_ms: int, current: str | None = None) -> dict | None:
    """The study's last complete run ending at `end_ms` if this process is the aggregate of its invocation, else
    as `.last_run.json` recorded it, else ending at its last job's end: {invocation, start_ms, end_ms,
    wall_time_s}; None before any job of a `snakemake` run (`lorarl run`, or files older than the invocation)."""
    subs = [(ms, s) for s in submissions(study, results_dir)
            if s.get("invocation") and (ms := _stamp_ms(s.get("submitted_at"))) is not None]
    if not subs:
        return None
    newest = max(subs, key=lambda x: x[0])[1]["invocation"]
    mine = [s for _, s in subs if s["invocation"] == newest]
    starts = [t for s in mine for a in s.get("attempts", []) if (t := _stamp_ms(a.get("started_at"))) is not None]
    if not starts:
        return None
    start = min(starts)
    path = Path(results_dir) / study.name / LAST_FILE  # current: this aggregate's invocation (None: by hand)
    if current != newest:  # not that run's aggregate: as its aggregate recorded it, else up to its last job's end
        saved = read_json(path)
        if isinstance(saved, dict) and saved.get("invocation") == newest:
            return saved
        ends = [e for s in mine for a in s.get("attempts", []) if (e := _stamp_ms(a.get("ended_at"))) is not None]
        end_ms = max(ends, default=start)
    run = {"invocation": newest, "start_ms": start, "end_ms": end_ms,
           "wall_time_s": round((end_ms - start) / 1000.0, 3)}
    if current == newest:
        write_json(path, run)
    return run


def cell_counts(study: Any, results_dir: str | Path) -> dict[str, float]:
    """study/cells_total, _finished, _failed, _diverged: the study's cells (base rows not counted)."""
    states = [r.train.state for r in study_status(study, results_dir) if r.kind == "cell"]
    out = {"study/cells_total": float(len(states))}
    out.update({name: float(sum(s in wanted for s in states)) for name, wanted in COUNTS.items()})
    return out


def record(tracker: Tracker, run_id: str, study: Any, results_dir: str | Path, outputs: Iterable[Path] = (),
           invocation: str | None = None) -> dict:
    """Stretch the parent run `run_id` over the study (end time) and log its wall time and cell counts;
    a metric is logged again only when its value changed. ``invocation``: the `snakemake` run this aggregate
    belongs to (None: by hand, or `sync-mlflow`). Returns the values."""
    from mlflow.entities import Metric

    run = tracker.retry("read the study run", lambda: tracker.client.get_run(run_id))
    start = run.info.start_time
    end = max(start, last_write_ms(study, results_dir, outputs) or int(time.time() * 1000))
    values = {WALL: round((end - start) / 1000.0, 3), **cell_counts(study, results_dir)}
    if values["study/cells_total"] and values["study/cells_finished"] == values["study/cells_total"]:
        last = last_run(study, results_dir, end, invocation)  # complete: the run that completed it, timed without the gaps
        if last is not None:
            values[LAST] = last["wall_time_s"]
    ts = int(time.time() * 1000)
    changed = [Metric(k, v, ts, 0) for k, v in values.items() if run.data.metrics.get(k) != v]
    if changed:
        tracker.retry("log the study's numbers", lambda: tracker.client.log_batch(run_id, metrics=changed))
    if run.info.end_time != end or run.info.status != "FINISHED":
        tracker.retry("end the study run", lambda: tracker.client.set_terminated(run_id, "FINISHED", end_time=end))
    return values
