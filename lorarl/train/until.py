"""Train a cell only up to a step: the hook an adaptive study's rung jobs use (docs/adaptive.md).

Kept apart from the trainers, so that it ports onto one cell-run object: ``train_cell`` and the pack job
call the few functions here and nothing else changes.

``LORARL_TRAIN_UNTIL=<step>`` (the workflow's ``train_rung`` rule sets it; the launcher carries it to the
job) makes a train or pack job train each cell from its last checkpoint up to training step ``step`` and
stop there the way a preempted job stops: the checkpoint at ``step`` is saved and KEPT (whatever
``train.checkpoint_every``), the snapshot at ``step`` is saved (a rung is a snapshot step), the cell's
outputs are NOT published, the MLflow run is left ``KILLED`` with the tag ``lorarl.state=at_rung`` (the next
segment reopens it, the search's decision retags it), and the **rung mark**
``results/<study>/<cell>/rungs/step-<step>.json`` is written last: the job's one output. The learning-rate
schedule, the data order and every RNG stream are those of the whole run (``train.steps``): a cell trained to
a rung and then to its end equals a cell trained in one go (tests/test_adaptive_until.py).

A cell that ends before ``step`` (diverged, stopped on collapse) publishes its outputs as always, has the
snapshots it never reached filled with its final policy (so its rung can be evaluated), and its mark says
``ended``. A cell already finished (its summary.json of this config) or already past ``step`` writes the mark
and trains nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.io import write_json

UNTIL_ENV = "LORARL_TRAIN_UNTIL"  # the training step a train/pack job stops at (an adaptive study's rung)
AT_RUNG = "at_rung"  # the MLflow tag lorarl.state of a cell waiting at a rung

__all__ = ["UNTIL_ENV", "until_step", "stopper", "mark_path", "staged_mark_path", "write_mark", "already_ended",
           "pause"]


def until_step() -> int | None:
    """The step of ``$LORARL_TRAIN_UNTIL`` (None: train to the end)."""
    raw = os.environ.get(UNTIL_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${UNTIL_ENV}={raw!r}: allowed: a positive training step")
    return int(raw)


def stopper(updates: int) -> Any:
    """The TrainerCallback that saves a checkpoint at optimiser update ``updates`` and stops there (``reached``)."""
    from transformers import TrainerCallback

    class StopAtRung(TrainerCallback):
        reached = False

        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= updates:
                control.should_save = control.should_training_stop = self.reached = True

    return StopAtRung()


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


def already_ended(results: str | Path, study: str, cell: Any, step: int) -> dict | None:
    """The mark of a cell that needs no training to reach ``step`` because it finished (summary.json of this
    config); None = train (a cell checkpointed at or past ``step`` is told by its trainer)."""
    cdir = paths.cell_dir(results, study, cell.id)
    try:
        summary = json.loads((cdir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    if summary is not None and summary.get("config_hash") == cell.hash:
        return {"ended": True, "state": summary.get("state", "done"), "mlflow_run_id": summary.get("mlflow_run_id")}
    return None


def pause(results: str | Path, study: str, cell: Any, step: int, run_id: str | None, ckpt: Any, tracker: Any,
          recorder: Any, work: Path | None, staged: bool = False) -> dict:
    """The end of a job stopped at ``step``: MLflow gets every step the checkpoint covers, the run is left
    KILLED and tagged, the checkpoint is kept and its lock released, the work folder goes; then the mark."""
    import shutil

    if recorder is not None:
        recorder.flush()
    if tracker is not None:
        try:
            tracker.set_tags({"lorarl.state": AT_RUNG, "lorarl.rung": str(step)})
        finally:
            tracker.finish("KILLED")
    ckpt.release()
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"[lorarl] cell {cell.id}: stopped at step {step} (an adaptive study's rung); checkpoint kept in "
          f"{ckpt.root}", flush=True)
    return write_mark(results, study, cell, step, staged=staged, ended=False, state=AT_RUNG, mlflow_run_id=run_id)
