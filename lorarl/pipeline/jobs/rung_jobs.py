"""The launcher's side of a job that trains a cell up to a rung (its ``--until``, lorarl.train.until).

Such a job's one output is the cell's rung mark ``<cell>/rungs/step-<step>.json``, not the cell's outputs:
:func:`expected` names it for the launcher's output check (lorarl.pipeline.jobs.inflight). When packs are on, the
pack job trains the member and leaves its mark staged beside it; the member's own rung job then waits for the
pack (its claim, as a member's `train` job does: lorarl.pack.publish), moves the outputs of a member that
ended into place, and moves the staged mark into place: :func:`handed_over`.
"""

from __future__ import annotations

from pathlib import Path

from lorarl.train.until import mark_path

__all__ = ["expected", "handed_over"]


def expected(results: str | Path, study: str, cell: str, step: int | None) -> list[Path] | None:
    """The output of this train job when it stops at a rung ``step`` (None: a train job to the end)."""
    return None if step is None else [mark_path(results, study, cell, step)]


def handed_over(results: str | Path, study: str, cell: str, config_hash: str, step: int | None) -> bool:
    """True when a pack trained the cell for this job (outputs, or the rung mark at ``step``, the job's ``--until``,
    now in place): nothing to submit. The hand-over's one door (lorarl.pack.handover.HandOver.take)."""
    from lorarl.pack.handover import HandOver

    return HandOver.of(results, study, cell).take(results, study, cell, config_hash, step)
