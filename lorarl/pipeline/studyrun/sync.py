"""`lorarl sync-mlflow <study>`: replay a study's files into a (new or repaired) MLflow store.

The files under results/ are the record; this rebuilds the view from them, exactly once per (metric,
step): for each finished cell (summary.json) it finds the cell's run (summary.json's run id, else the
active run tagged with the cell id, else a new run with the cell's params and tags), reads which
(metric, step) pairs the run already holds, and logs only the missing ones from metrics.csv (per-step
training metrics), summary.json (final reward, wall time, parameter counts at step 0), eval/*.json
(each at its training step, as lorarl.evaluate.main logs them) and diagnostics.parquet (diag/* means).
Base pseudo-cells get their shared run (base/mlflow_run.json) and evaluation numbers the same way.
A new run id is written back into summary.json with its modification time kept (Snakemake's mtime
trigger must not rerun anything). The study's parent run gets what the aggregate gives it
(lorarl.pipeline.studyrun.study_run.fill: tags, artifacts, its span and cell counts); a new one starts where the
files say the study did. A cell's run left RUNNING by a process that is gone (its cell lock free) is ended
KILLED first (lorarl.tracking.dead_runs). Run it again: nothing is logged twice.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.tracking.client import CELL_TAG, SUPERSEDED_TAG, Tracker
from lorarl.tracking.dead_runs import end_dead_runs
from lorarl.pipeline.studyrun.study_run import fill
from lorarl.pipeline.studyrun.study_span import first_start_ms

TRAIN_SUMMARY = ("final_train_reward", "wall_time_s", "params_trainable", "trainable_fraction")


def _present(tracker: Tracker, run_id: str) -> set[tuple[str, int]]:
    run = tracker.retry("read the run", lambda: tracker.client.get_run(run_id))
    out = set()
    for key in run.data.metrics:
        hist = tracker.retry("read a metric history", lambda: tracker.client.get_metric_history(run_id, key))
        out |= {(key, m.step) for m in hist}
    return out


def _csv_rows(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            row = {"step": int(float(r["step"]))}
            for k, v in r.items():
                if k != "step" and v not in ("", None):
                    row[k] = float(v)
            rows.append(row)
    return rows


def _eval_rows(cfg: Any, cell_dir: Path, is_base: bool) -> list[dict[str, float]]:
    from lorarl.evaluate.main import _mlflow_step, metric_values

    by_step: dict[int, dict[str, float]] = {}
    for f in sorted((cell_dir / "eval").glob("*.json")):
        s = json.loads(f.read_text())
        by_step.setdefault(_mlflow_step(cfg, is_base, s.get("step")), {}).update(metric_values(s))
    return [{"step": k, **v} for k, v in sorted(by_step.items())]


def _diag_row(cell_dir: Path) -> dict[str, float]:
    f = cell_dir / "diagnostics.parquet"
    if not f.exists():
        return {}
    import pandas as pd

    from lorarl.diagnose.main import SUMMARY_METRICS

    df = pd.read_parquet(f)
    means = df[df["metric"].isin(SUMMARY_METRICS)].groupby("metric")["value"].mean()
    return {f"diag/{m}": float(v) for m, v in means.items()}


def _log_missing(tracker: Tracker, run_id: str, rows: list[dict[str, float]]) -> tuple[int, int]:
    """Log each (metric, step) of `rows` the run lacks; returns (logged, already present)."""
    import time

    from mlflow.entities import Metric

    have = _present(tracker, run_id)
    ts = int(time.time() * 1000)
    todo, present = {}, 0
    for row in rows:
        step = int(row["step"])
        for k, v in row.items():
            if k == "step" or v is None:
                continue
            if (k, step) in have:
                present += 1
            else:
                todo[(k, step)] = Metric(k, float(v), ts, step)
    items = list(todo.values())
    for i in range(0, len(items), 500):
        chunk = items[i : i + 500]
        tracker.retry("log metrics", lambda: tracker.client.log_batch(run_id, metrics=chunk))
    return len(items), present


def _find_run(tracker: Tracker, cell: Any, summary: dict) -> tuple[str | None, str]:
    rid = summary.get("mlflow_run_id")
    if rid:
        try:
            run = tracker.client.get_run(rid)
            if run.info.lifecycle_stage == "active":
                return rid, "found"
        except Exception:  # noqa: BLE001 - not in this store
            pass
    runs = tracker.retry("search runs", lambda: tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{CELL_TAG}` = '{cell.id}'", order_by=["attributes.start_time DESC"]))
    runs = [r for r in runs if r.data.tags.get(SUPERSEDED_TAG) != "true" and r.data.tags.get("lorarl.base") != "true"]
    if runs:
        return runs[0].info.run_id, "found by cell tag"
    return None, "created"


def _rewrite_run_id(summary_path: Path, summary: dict, run_id: str) -> None:
    st = summary_path.stat()
    tmp = summary_path.with_name(summary_path.name + ".sync.tmp")
    tmp.write_text(json.dumps({**summary, "mlflow_run_id": run_id}, indent=2, sort_keys=True, default=str) + "\n")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # no Snakemake rerun for a changed run id
    os.replace(tmp, summary_path)


def sync_cell(tracker: Tracker, study: Any, cell: Any, results_dir: str | Path) -> dict | None:
    kw = dict(results=str(results_dir), study=study.name, cell=cell.id)
    summary_path = paths.path("summary", **kw)
    if not summary_path.exists():
        return None  # not finished: its checkpoint resumes into its own run
    summary = json.loads(summary_path.read_text())
    run_id, how = _find_run(tracker, cell, summary)
    if run_id is None:
        run_id = tracker.start(cell.id, run_name=cell.id, tags={
            "lorarl.config_hash": cell.hash, "lorarl.synced": "true",
            **{f"axis.{k}": v for k, v in cell.axes.items()}}, params=cell.flat_config())
    if run_id != summary.get("mlflow_run_id"):
        _rewrite_run_id(summary_path, summary, run_id)
    cdir = summary_path.parent
    if study.kind == "kl_bound_toy":  # what lorarl.toy.cells logs: every number of its row (bools as 0/1)
        rows = [{"step": 0, **{k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}}]
    else:
        scalars = {k: float(summary[k]) for k in TRAIN_SUMMARY if isinstance(summary.get(k), (int, float))}
        rows = _csv_rows(paths.path("metrics", **kw)) + [{"step": 0, **scalars, **_diag_row(cdir)}]
        rows += _eval_rows(cell.config, cdir, is_base=False)
    logged, present = _log_missing(tracker, run_id, rows)
    tracker.retry("end the run", lambda: tracker.client.set_terminated(run_id, status="FINISHED"))
    return {"cell": cell.id, "run_id": run_id, "run": how, "logged": logged, "present": present, "uri": tracker.uri}


def sync_base(tracker: Tracker, study: Any, base: Any, results_dir: str | Path) -> dict | None:
    from lorarl.evaluate.main import _attach_run

    cdir = paths.cell_dir(results_dir, study.name, base.id)
    rows = _eval_rows(base.config, cdir, is_base=True)
    if not rows:
        return None
    run_id = _attach_run(tracker, study.name, base, results_dir, is_base=True, create=True)
    logged, present = _log_missing(tracker, run_id, rows)
    tracker.retry("end the run", lambda: tracker.client.set_terminated(run_id, status="FINISHED"))
    return {"cell": base.id, "run_id": run_id, "run": "base", "logged": logged, "present": present,
            "uri": tracker.uri}


def sync_study(study_path: str | Path, results_dir: str | Path = "results") -> list[dict]:
    from lorarl.language.study import base_cells, load_study, study_cells

    study = load_study(study_path)
    tracker = Tracker(results_dir, study.name)
    tracker.study_run(start_time=first_start_ms(study, results_dir))  # a new parent starts where the study did
    end_dead_runs(tracker, "seen by lorarl sync-mlflow")  # an unfinished cell's run whose process is gone
    out = [sync_cell(tracker, study, c, results_dir) for c in study_cells(study)]
    if study.kind != "kl_bound_toy":
        out += [sync_base(tracker, study, b, results_dir) for b in base_cells(study)]
    fill(tracker, study, results_dir)  # the parent as the aggregate leaves it: tags, artifacts, span, counts
    return [r for r in out if r is not None]
