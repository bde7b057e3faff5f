"""The launcher's side of a job that trains a cell up to a rung (its ``--until``, lorarl.train.until).

Such a job's one output is the cell's rung mark ``<cell>/rungs/step-<step>.json``, not the cell's outputs:
:func:`expected` names it for the launcher's output check (lorarl.pipeline.jobs.inflight). When packs are on, the
pack job trains the member and leaves its mark staged beside it; the member's own rung job then waits for the
pack (its claim, as a member's `train` job does: lorarl.pack.publish), moves the outputs of a member that
ended into place, and moves the staged mark into place: :func:`handed_over`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lorarl.train.until import mark_path, staged_mark_path

__all__ = ["expected", "handed_over"]


def expected(results: str | Path, study: str, cell: str, step: int | None) -> list[Path] | None:
    """The output of this train job when it stops at a rung ``step`` (None: a train job to the end)."""
    return None if step is None else [mark_path(results, study, cell, step)]


def _hash(p: Path) -> str | None:
    try:
        return json.loads(p.read_text()).get("config_hash")
    except (OSError, ValueError):
        return None


def handed_over(results: str | Path, study: str, cell: str, config_hash: str, step: int | None) -> bool:
    """True when a pack trained the cell for this job (outputs, or the rung mark at ``step``, the job's ``--until``,
    now in place): nothing to submit."""
    from lorarl.pack.publish import wait_and_publish

    published = wait_and_publish(results, study, cell, config_hash)  # a pack that holds the cell: wait for it
    if step is None:
        if published:
            print(f"[lorarl] train {cell}: trained in its pack; outputs moved into place", flush=True)
        return published
    staged = staged_mark_path(results, study, cell, step)
    if _hash(staged) != config_hash:
        return False
    os.replace(staged, mark_path(results, study, cell, step))
    print(f"[lorarl] train {cell}: trained to step {step} in its pack; rung mark moved into place", flush=True)
    return True
