"""Is a checkpoint safe to resume from? File manifests, verification, and the crash-loop breaker.

`lorarl.train.checkpoint` writes a checkpoint's `lorarl.json` mark last; this module adds what the mark
alone cannot tell:
* a manifest in the mark: every file of the checkpoint with its size, and its sha256 when it is at
  most `HASH_LIMIT` bytes (an adapter, optimizer and RNG states of a LoRA run; the multi-GB files of
  a full fine-tune are checked by size only). A truncated, missing or altered file is detected before
  anything is loaded;
* a resume counter (`.resuming` in the checkpoint folder): set when a run starts from the checkpoint,
  removed by the first step that completes after it. A checkpoint that `MAX_FAILED_RESUMES` runs in a
  row died on before finishing a single step (unreadable content the manifest cannot see, a library
  change) is discarded instead of being tried forever.
A rejected checkpoint is reported (stderr, and `checkpoint_problems` in the cell's summary.json) and
deleted; the previous complete checkpoint, or else a fresh start, is used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

HASH_LIMIT = 256 * 2**20  # files up to this size get a sha256 in the manifest (bigger: size only)
MAX_FAILED_RESUMES = 2  # resumes that died before one step, in a row, before a checkpoint is discarded
RESUMING = ".resuming"
MARKER = "lorarl.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(folder: Path) -> dict[str, list]:
    """{relative path: [size, sha256 or None]} of every file of a checkpoint but its mark."""
    out: dict[str, list] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if not p.is_file() or rel in (MARKER, RESUMING):
            continue
        size = p.stat().st_size
        out[rel] = [size, _sha256(p) if size <= HASH_LIMIT else None]
    return out


def verify(folder: Path, meta: dict[str, Any]) -> str | None:
    """None if the files match the manifest of the mark, else what is wrong (first problem found).
    A mark without a manifest (written before manifests existed) is trusted as before."""
    files = meta.get("files")
    if files is None:
        return None
    for rel, (size, digest) in sorted(files.items()):
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        got = p.stat().st_size
        if got != size:
            return f"{rel} has {got} bytes, {size} expected (truncated or overwritten)"
        if digest and _sha256(p) != digest:
            return f"{rel} does not match its sha256 (corrupted)"
    return None


def failed_resumes(folder: Path) -> int:
    """How many runs started from this checkpoint and died before completing one step."""
    try:
        return int(json.loads((folder / RESUMING).read_text()).get("count", 0))
    except (FileNotFoundError, ValueError, AttributeError):
        return 0


def start_resume(folder: Path) -> None:
    """A run is about to load this checkpoint: count it until a step completes."""
    tmp = folder / (RESUMING + ".tmp")
    tmp.write_text(json.dumps({"count": failed_resumes(folder) + 1, "pid": os.getpid()}))
    os.replace(tmp, folder / RESUMING)


def resume_worked(folder: Path) -> None:
    """A step completed after loading this checkpoint: it is readable."""
    (folder / RESUMING).unlink(missing_ok=True)


def problem(folder: Path, meta: dict[str, Any], config_hash: str) -> str | None:
    """Why this complete checkpoint must not be resumed from, or None."""
    other = meta.get("config_hash")
    if other != config_hash:
        return f"it belongs to another config ({other}; this cell is now {config_hash})"
    bad = verify(folder, meta)
    if bad:
        return bad
    n = failed_resumes(folder)
    if n >= MAX_FAILED_RESUMES:
        return f"{n} runs in a row died resuming from it before finishing a step"
    return None
