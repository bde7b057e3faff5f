"""Train a cell only up to a step: the rung jobs of an adaptive study (docs/adaptive.md).

The job's ``--until <step>`` (written by the workflow's ``train_rung`` rule and by a rung's ``train_pack`` rule;
``lorarl launch`` parses it into the job's parameters, lorarl.pipeline.jobs.jobparams, which travel with the job) is
read at the job's entry (the ``train`` and ``pack`` stages, lorarl.pipeline.jobs.stages: ``job.params.until``) and
handed to the trainer as its ``stop_at``
(:func:`lorarl.train.main.train_cell`, :func:`lorarl.pack.run.train_pack`, :func:`lorarl.pack.run.train_alone`).
A rung stop IS a pause of the cell's run, the one way a run pauses (lorarl.train.cellrun): the checkpoint at
``step`` holds the full state and is kept (whatever ``train.checkpoint_every``), the snapshot at ``step`` is
saved (a rung is a snapshot step), nothing is published, ``paused.json`` is written beside the checkpoint, the
MLflow run ends with the tag ``lorarl.state=paused`` (the next segment reopens it; a stop by the search retags
it ``stopped``), the lock is released. The learning-rate schedule, the data order and every RNG stream are those
of the whole run (``train.steps``): a cell trained to a rung and then to its end equals a cell trained in one go
(tests/train/test_adaptive_until.py).

Then the stage writes the **rung mark** ``results/<study>/<cell>/rungs/step-<step>.json`` from the run's outcome
(:func:`mark_fields`), last: the rung job's one output. Paused at the rung: ``state: at_rung``, ``ended: false``.
Ended before it (diverged, stopped on collapse): its outputs published as always, the snapshots it never
reached filled with its final policy (so the rung can be evaluated), ``ended: true``. Already finished (its
summary.json of this config, :func:`already_ended`): the mark, no training. A pack job leaves each member's
mark staged (:func:`staged_mark_path`); the member's own rung job moves it into place (lorarl.pipeline.jobs.rung_jobs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.io import write_json

AT_RUNG = "at_rung"  # the rung mark's state of a cell paused at its rung (its MLflow run says lorarl.state=paused)

__all__ = ["AT_RUNG", "mark_path", "staged_mark_path", "write_mark", "mark_fields",
           "already_ended"]


def mark_path(results: str | Path, study: str, cell: str, step: int) -> Path:
    return paths.path("rung_mark", results=results, study=study, cell=cell, step=step)


def staged_mark_path(results: str | Path, study: str, cell: str, step: int) -> Path:
    """Where a pack job leaves a member's mark: the member's own rung job moves it into place (Snakemake
    removes a job's declared outputs before it runs, so no other job may write them)."""
    p = mark_path(results, study, cell, step)
    return p.with_name(f".staged-{p.name}")


def write_mark(results: str | Path, study: str, cell: Any, step: int, staged: bool = False, **fields: Any) -> dict:
    doc = {"cell": cell.id, "config_hash": cell.hash, "step": step, **fields}
    write_json((staged_mark_path if staged else mark_path)(results, study, cell.id, step), doc)
    return doc


def mark_fields(outcome: dict) -> dict:
    """A rung mark's fields from the run's outcome: a paused run (lorarl.train.cellrun.CellRun.close at its stop_at) waits at
    the rung; anything else is the cell's summary (it ended: done, diverged, or stopped on collapse)."""
    if outcome.get("state") == "paused":
        return {"ended": False, "state": AT_RUNG, "paused_at_step": outcome.get("paused_at_step"),
                "mlflow_run_id": outcome.get("mlflow_run_id")}
    out = {"ended": True, "state": outcome.get("state", "done"), "mlflow_run_id": outcome.get("mlflow_run_id")}
    if outcome.get("stopped_on_collapse") is not None:
        out["stopped_on_collapse"] = outcome["stopped_on_collapse"]
    return out


def already_ended(results: str | Path, study: str, cell: Any) -> dict | None:
    """The summary of a cell that needs no training to reach any rung because it finished (summary.json of this
    config); None = train (a cell checkpointed at or past the rung pauses there without a step)."""
    try:
        summary = json.loads((paths.cell_dir(results, study, cell.id) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("config_hash") == cell.hash else None
