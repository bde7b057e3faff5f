"""The study's home in MLflow: its parent run's tags and artifacts, refreshed by the aggregate stage.

Every cell and base run nests under one parent run per study (lorarl.tracking.client.Tracker.study_run
makes it, once, when the first cell starts). `publish` gives it the study's name, its axes and the
code its cells ran (their jobs' provenance records; the checkout now apart, as `checkout.*`) as tags, and the aggregate's outputs as artifacts: report.html, tables/, figures/
(logged again on every aggregate, so the parent shows the latest), and stretches it over the study:
from the first job's start to the aggregate's end, with the wall time and cell counts as metrics
(lorarl.pipeline.studyrun.study_span). Superseded cell runs are untouched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.pipeline.studyrun import study_span
from lorarl.tracking import sqlite_store
from lorarl.provenance import cell_code
from lorarl.provenance import code_tags as _tags
from lorarl.tracking.client import PACKAGES, Tracker, git_state, package_versions, resolve_tracking


def axes_tag(study: Any) -> str:
    """`{"rank": ["r1", "r2"], "seed": ["s0", "s1"]}`: each axis with its values as cell ids show them."""
    from lorarl.language.matrix import label_of

    return json.dumps({name: [f"{ax.prefix}{label_of(v)}" for v in ax.values] for name, ax in study.axes.items()})


def code_tags(study: Any, results_dir: str | Path) -> dict[str, str]:
    """The code the study's cells ran, from their jobs' provenance records (`git.sha`, `git.dirty`, `git.diff_hash`,
    `version.*`: "mixed" where cells differ; `lorarl.code_states`, `lorarl.code_mixed`), and this checkout now as
    `checkout.git.sha`, `checkout.git.dirty`, `checkout.version.*` (lorarl.provenance.code_tags)."""
    from lorarl.language.study import study_cells

    cells = [c.id for c in study_cells(study)]
    return _tags(cell_code(results_dir, study.name, cells, PACKAGES), {**git_state(), **package_versions()})


def artifacts(study: Any, results_dir: str | Path) -> list[tuple[Path, str]]:
    """(local file or folder, artifact folder) of what the aggregate wrote for the study."""
    sdir = Path(results_dir) / study.name
    tables = paths.path("table_csv", results=results_dir, study=study.name).parent
    figures = paths.path("figures", results=results_dir, study=study.name)
    out = [(sdir / "report.html", ""), (tables, "tables"), (figures, "figures")]
    return [(p, where) for p, where in out if p.exists() and (p.is_file() or any(p.iterdir()))]


def publish(study: Any, results_dir: str | Path = "results", tracking: str | None = None,
            price: float | None = None, invocation: str | None = None) -> str | None:
    """Tag the study's parent run and log its artifacts; the run id, or None when no cell has used the
    store yet (no results/mlflow.db: nothing to nest, and making a store here would cost seconds).
    ``invocation``: the `snakemake` run of this aggregate (`lorarl aggregate --invocation`; None by hand)."""
    db = sqlite_store.db_path(resolve_tracking(tracking, results_dir))
    if db is not None and not db.exists():
        return None
    return fill(Tracker(results_dir, study.name, tracking), study, results_dir, price, invocation)


def fill(tracker: Tracker, study: Any, results_dir: str | Path, price: float | None = None,
         invocation: str | None = None) -> str:
    """What `publish` does, with an open Tracker (`lorarl sync-mlflow` too): the parent's tags, artifacts,
    span and numbers (lorarl.pipeline.studyrun.study_span). Made here if the store has none, starting where the
    files say the study started."""
    run_id = tracker.study_run(start_time=study_span.first_start_ms(study, results_dir))
    tracker.run_id = run_id
    tracker.set_tags({"lorarl.study": study.name, "lorarl.axes": axes_tag(study), **code_tags(study, results_dir)})
    outputs = artifacts(study, results_dir)
    for local, where in outputs:
        log = tracker.client.log_artifacts if local.is_dir() else tracker.client.log_artifact
        tracker.retry(f"log {local.name} to the study run", lambda: log(run_id, str(local), where or None))
    study_span.record(tracker, run_id, study, results_dir, [local for local, _ in outputs], invocation)
    from lorarl.report import cost

    cost.log_mlflow(tracker, run_id, study, results_dir, cost.cost_table(study, results_dir, price))  # cost/*
    return run_id
