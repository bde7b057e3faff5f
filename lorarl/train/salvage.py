"""A finished cell that a killed Snakemake would throw away: kept aside, then put back instead of retrained.

When Snakemake is killed, its running `train` jobs go on (their launchers are orphans) and their outputs get
Snakemake's "incomplete" marks. A job that finishes before the rerun builds its DAG leaves whole outputs under
those marks, and the rerun (`rerun-incomplete`) deletes them just before it runs the job again; the finished
job also removed its checkpoints, so the new job would train the cell from scratch: the same result, paid for
twice, in a new MLflow run.

So the Snakefile's `onstart` (nothing runs yet) hands every `train` job that reruns for that reason alone to
:func:`keep_aside`: when the cell's outputs are whole and of the cell's config (summary.json with its
config hash, every other output present), they are hard-linked into ``<cell>/.salvaged/`` (no copy: the
same files). Snakemake then deletes its names for them; the job, once it holds the cell's lock
(lorarl.train.cellrun), calls :func:`restore`, which moves them back (summary.json last) and trains nothing.
A job Snakemake reruns for any other reason (forced, changed params or code, updated input) gets nothing
kept aside, and :func:`discard` drops what an earlier run kept for it, so `--forcerun` always retrains.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from lorarl import paths

__all__ = ["SALVAGED", "keep_aside", "keep_aside_for", "restore", "discard", "describe"]

SALVAGED = ".salvaged"
OUTPUTS = paths.CELL_OUTPUTS  # the train rule's outputs; summary.json last


def _folder(results: str | Path, study: str, cell: str) -> Path:
    return paths.cell_dir(results, study, cell) / SALVAGED


def _whole(cell_dir: Path, config_hash: str) -> bool:
    try:
        summary = json.loads((cell_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(summary, dict) and summary.get("config_hash") == config_hash
            and all((cell_dir / name).exists() for name in OUTPUTS))


def _link(src: Path, dst: Path) -> None:
    if src.is_dir():
        dst.mkdir(parents=True)
        for p in sorted(src.iterdir()):
            _link(p, dst / p.name)
    else:
        os.link(src, dst)


def keep_aside(results: str | Path, study: str, cell: str, config_hash: str) -> bool:
    """Hard-link the cell's whole outputs of ``config_hash`` into its ``.salvaged`` folder (True), or keep
    nothing (False: some output missing, or of another config)."""
    cdir = paths.cell_dir(results, study, cell)
    discard(results, study, cell)
    if not _whole(cdir, config_hash):
        return False
    tmp = cdir / f"{SALVAGED}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in OUTPUTS:
        _link(cdir / name, tmp / name)
    os.replace(tmp, _folder(results, study, cell))  # whole or absent
    return True


def restore(results: str | Path, study: str, cell: str, config_hash: str) -> dict | None:
    """Move the kept outputs of ``config_hash`` back into place (summary.json last) and return the summary; None
    when nothing of that config is kept (anything else kept is dropped). Call it holding the cell's lock."""
    kept = _folder(results, study, cell)
    if not kept.is_dir():
        return None
    if not _whole(kept, config_hash):
        discard(results, study, cell)
        return None
    cdir = paths.cell_dir(results, study, cell)
    for name in OUTPUTS:
        target = cdir / name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(kept / name, target)
    shutil.rmtree(kept, ignore_errors=True)
    return json.loads((cdir / "summary.json").read_text())


def discard(results: str | Path, study: str, cell: str) -> None:
    """Drop what was kept aside for the cell (a forced rerun retrains it)."""
    shutil.rmtree(_folder(results, study, cell), ignore_errors=True)
    shutil.rmtree(paths.cell_dir(results, study, cell) / f"{SALVAGED}.tmp", ignore_errors=True)


def keep_aside_for(job_reasons: list[str], results: str | Path, study: str, cell: str, config_hash: str) -> bool:
    """`onstart`: a `train` job Snakemake reruns only because its outputs are marked incomplete gets its whole
    outputs kept aside; any other reason drops what an earlier run kept (True: kept)."""
    if job_reasons == ["incomplete output files"]:
        return keep_aside(results, study, cell, config_hash)
    discard(results, study, cell)
    return False


def describe(kept: list[Any]) -> list[str]:
    """`onstart`'s lines for the cells kept aside."""
    return [f"[lorarl] {s}/{c}: finished by a job of the killed run; its outputs are kept and put back by its "
            f"train job, not retrained" for s, c in kept]
