"""A pack member's staged outputs (light: no torch here): staging in the pack job, publishing by the member's job.

The pack job (rule ``train_pack``, :mod:`lorarl.pack.run`) trains the members and STAGES each member's outputs in
``<cell dir>/.packed/`` (:func:`stage`, through lorarl.pack.handover.stage, which also moves the member's hand-over
to ``staged``); the member's own ``train`` job waits for its pack and moves them into place (:func:`publish`:
``os.replace`` each, ``summary.json`` last, if their config hash is the cell's, plus the pack's provenance). Who
waits for whom, and how long, is the hand-over's (:mod:`lorarl.pack.handover`, one state file per member);
otherwise (no pack, or the pack failed on this cell or paused it) the member's job trains the cell: from a member's
checkpoint as a pack of one (:func:`lorarl.pack.run.train_alone`, the same run), else solo as always.

A cell that finished (or was staged) is never put in a pack, so ``--forcerun`` of one member's
summary.json reruns that cell alone, solo, with the TRL-based trainer (its pack-mates stay as they are).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from lorarl import paths
from lorarl.train import salvage

STAGED = ".packed"  # <cell dir>/.packed/: a pack's finished outputs of this cell, not yet in place


def _summary_hash(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("config_hash")
    except (OSError, ValueError):
        return None


def staged_dir(results_dir: str | Path, study: str, cell: str) -> Path:
    return paths.cell_dir(results_dir, study, cell) / STAGED


def unfinished(results_dir: str | Path, study: str, cell: str, config_hash: str) -> bool:
    """True unless the cell's outputs (in place or staged by a pack) are of this config."""
    kw = dict(results=str(results_dir), study=study, cell=cell)
    if _summary_hash(paths.path("summary", **kw)) == config_hash:
        return False
    return _summary_hash(staged_dir(results_dir, study, cell) / "summary.json") != config_hash


def stage(work: Path, cell_dir: Path) -> Path:
    """Move a member's finished work folder to ``<cell dir>/.packed`` (one rename)."""
    dst = cell_dir / STAGED
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(work, dst)
    return dst


def publish(results_dir: str | Path, study: str, cell: str, config_hash: str) -> bool:
    """Move the staged outputs of the cell into place (summary.json last); False if none are staged."""
    src = staged_dir(results_dir, study, cell)
    if _summary_hash(src / "summary.json") != config_hash:
        return False
    salvage.publish(src, results_dir, study, cell, config_hash)  # summary.json last; links kept for a later kill
    _copy_provenance(results_dir, study, cell)
    return True


def _copy_provenance(results_dir: str | Path, study: str, cell: str) -> None:
    """The member's provenance/train.json: the pack job's own record, plus which pack trained it."""
    from lorarl import provenance

    summary = json.loads(paths.path("summary", results=str(results_dir), study=study, cell=cell).read_text())
    pack_id = (summary.get("pack") or {}).get("id")
    if not pack_id:
        return
    src = provenance.provenance_path(results_dir, study, paths.pack_folder(pack_id), "pack")
    dst = provenance.provenance_path(results_dir, study, cell, "train")
    dst.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(src.read_text()) if src.exists() else {}
    doc["packed"] = {"pack": pack_id, "members": summary["pack"].get("members", []), "record": str(src)}
    tmp = dst.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, dst)
