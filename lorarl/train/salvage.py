"""A finished cell that Snakemake would throw away after a kill: its outputs kept, then put back instead of retrained.

When Snakemake is killed, its running `train` jobs go on (their launchers are orphans), and a job that finishes
after the kill leaves whole outputs that the rerun deletes before it runs the job again; that job removed its
checkpoints when it finished, so the new job would train the cell from scratch: the same result, paid twice, in a
new MLflow run. Two ways it happens:

* the orphan finished before the rerun started: its outputs carry the killed run's "incomplete" marks, and
  `rerun-incomplete` forces the job (as `--forcerun` would);
* the orphan finishes after the rerun built its DAG (outputs missing then) but before the rerun's job starts:
  Snakemake deletes the "unexpected" outputs just before it runs the job.

So every published cell keeps hard links to its outputs in ``<cell>/.salvaged/`` (:func:`keep_published`: no
copy, the same files) with the time it was published. A later job of the same config that holds the cell's lock
and finds its outputs gone calls :func:`restore`, which moves them back (summary.json last) and trains nothing, when
either they were published after its Snakemake run started (the second case: they were not there when it
decided to run the job), or that run's `onstart` found the job rerun only for the incomplete marks of whole
outputs (the first case: :func:`allow`, workflow/rules/train.smk). Otherwise (forced by the user, changed params or
code of outputs that were there at the start) the kept links are dropped and the cell retrains.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from lorarl import paths

__all__ = ["SALVAGED", "publish", "keep_published", "allow", "restore", "discard", "describe", "invocation_start"]

SALVAGED = ".salvaged"
OUTPUTS = paths.CELL_OUTPUTS  # the train rule's outputs; summary.json last
RECORD = "published.json"  # {"config_hash", "published_at", "allowed": [invocations whose onstart allowed a restore]}


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


def _record(kept: Path) -> dict:
    try:
        doc = json.loads((kept / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def invocation_start(invocation: str | None) -> float | None:
    """The start (epoch seconds) of the Snakemake run named ``invocation`` (``<host>-<pid>-<epoch>``,
    workflow/rules/common.smk), or None."""
    tail = (invocation or "").rsplit("-", 1)[-1]
    return float(tail) if tail.isdigit() else None


def keep_published(results: str | Path, study: str, cell: str, config_hash: str) -> bool:
    """Hard-link the cell's whole outputs of ``config_hash``, just published, into its ``.salvaged`` folder with
    the time (True); False when they are not whole or the file system has no hard links (nothing kept)."""
    cdir = paths.cell_dir(results, study, cell)
    discard(results, study, cell)
    if not _whole(cdir, config_hash):
        return False
    tmp = cdir / f"{SALVAGED}.tmp"
    try:
        tmp.mkdir()
        for name in OUTPUTS:
            _link(cdir / name, tmp / name)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    (tmp / RECORD).write_text(json.dumps({"config_hash": config_hash, "published_at": time.time(), "allowed": []}))
    os.replace(tmp, _folder(results, study, cell))  # whole or absent
    return True


def allow(results: str | Path, study: str, cell: str, config_hash: str, invocation: str) -> bool:
    """`onstart` of ``invocation``: the cell's job reruns only for the incomplete marks of its whole outputs; let
    that run's job put them back (True). Outputs published before links were kept get them now."""
    kept = _folder(results, study, cell)
    if _record(kept).get("config_hash") != config_hash and not keep_published(results, study, cell, config_hash):
        return False
    doc = _record(kept)
    doc["allowed"] = [*doc.get("allowed", []), invocation]
    (kept / RECORD).write_text(json.dumps(doc))
    return True


def restore(results: str | Path, study: str, cell: str, config_hash: str, invocation: str | None) -> dict | None:
    """Move the kept outputs of ``config_hash`` back into place (summary.json last) and return the summary, when
    they were published after the run ``invocation`` started or its `onstart` allowed it; otherwise drop them and
    return None. Call it holding the cell's lock, its outputs not in place."""
    kept = _folder(results, study, cell)
    if not kept.is_dir():
        return None
    doc, started = _record(kept), invocation_start(invocation)
    ok = (doc.get("config_hash") == config_hash and _whole(kept, config_hash) and invocation is not None
          and (invocation in doc.get("allowed", []) or (started is not None and doc.get("published_at", 0) >= started)))
    if not ok:
        discard(results, study, cell)
        return None
    publish(kept, results, study, cell, config_hash)  # and kept again, for a later kill
    return json.loads((paths.cell_dir(results, study, cell) / "summary.json").read_text())


def publish(src: Path, results: str | Path, study: str, cell: str, config_hash: str) -> None:
    """Move a cell's outputs from ``src`` (a job's work folder, a pack's staging, the kept links) into place,
    summary.json last (the "done" mark), remove ``src``, and keep links to them for a later kill."""
    cdir = paths.cell_dir(results, study, cell)
    for name in OUTPUTS:
        target = cdir / name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(src / name, target)
    shutil.rmtree(src, ignore_errors=True)
    keep_published(results, study, cell, config_hash)


def discard(results: str | Path, study: str, cell: str) -> None:
    """Drop what was kept for the cell (a forced rerun retrains it)."""
    shutil.rmtree(_folder(results, study, cell), ignore_errors=True)
    shutil.rmtree(paths.cell_dir(results, study, cell) / f"{SALVAGED}.tmp", ignore_errors=True)


def describe(kept: list[tuple[str, str]]) -> list[str]:
    """`onstart`'s lines for the cells whose outputs their train job puts back."""
    return [f"[lorarl] {s}/{c}: finished by a job of the killed run; its train job puts its outputs back, no "
            f"retraining" for s, c in kept]
