"""Hand-over between a pack job and its members' own ``train`` jobs (light: no torch here).

Snakemake keeps ONE producer per cell output: the cell's ``train`` rule, whose command, params and
inputs do not change when packing is switched on or off (so switching never reruns a finished cell).
The pack job (rule ``train_pack``, :mod:`lorarl.pack.run`) trains the members and STAGES each member's
outputs in ``<cell dir>/.packed/``; the member's ``train`` job (``lorarl launch train``) then:

1. waits while the pack launcher's **claim** on the cell (``<cell dir>/.pack.claim``: pid, host, pack)
   is alive (written by ``lorarl launch pack`` before it submits, removed when its job ends) and the member's
   outputs of this config are not staged yet: a member that ends before its pack (a shorter cell in a resident
   pack, a collapse stop) is published at once, so its evaluation need not wait for the whole pack.
   Snakemake starts a pack's job and its members' jobs together, in no fixed order, so before any job runs
   (``onstart``) it claims every member of the packs it will run as **pending**, in its own name
   (:func:`claim_pending`): a member's launcher that starts before its pack's launcher has claimed the cell
   waits for it (at most ``$LORARL_PACK_PENDING_S``, 300 s: a pack launcher that died before claiming);
2. publishes the staged outputs (``os.replace`` each, ``summary.json`` last) if their config hash is
   the cell's, and copies the pack's provenance; the launcher submits nothing;
3. otherwise (no pack, or the pack failed on this cell or paused it) trains the cell: from a member's checkpoint
   as a pack of one (:func:`lorarl.pack.run.train_alone`, the same run), else solo as always.

A claim outlives a kill of its holder (the pack's launcher, or Snakemake's pending one): a holder gone on this host
makes it stale. Stale claims are ignored by every reader (:func:`claim_alive`), said once by a member's launcher
that finds one, and removed when the next `snakemake` starts (``onstart``, :func:`clear_stale_claims`), each with a
log line; a claim of another host is kept (its process cannot be checked from here).

A cell that finished (or was staged) is never put in a pack, so ``--forcerun`` of one member's
summary.json reruns that cell alone, solo, with the TRL-based trainer (its pack-mates stay as they are).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from lorarl import paths
from lorarl.train import salvage
from lorarl.io import atomic_write_text, pid_alive

STAGED = ".packed"  # <cell dir>/.packed/: a pack's finished outputs of this cell, not yet in place
CLAIM = ".pack.claim"  # <cell dir>/.pack.claim: a pack launcher is (about to be) training this cell
GRACE_ENV = "LORARL_PACK_GRACE_S"  # a member launcher's wait for a pack launcher starting beside it
PENDING_ENV = "LORARL_PACK_PENDING_S"  # a member launcher's wait on a pending claim for its pack launcher's own
PENDING = "pending"  # a claim's 4th field: written by Snakemake (claim_pending), not yet by the pack's launcher


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


def claim_path(results_dir: str | Path, study: str, cell: str) -> Path:
    return paths.cell_dir(results_dir, study, cell) / CLAIM


def _write_claim(p: Path, *fields: str) -> Path:
    """One claim line in this process's name, replaced in one rename: a member's launcher reading it while the pack's
    launcher takes over Snakemake's pending claim never sees an empty file."""
    atomic_write_text(p, " ".join((str(os.getpid()), socket.gethostname(), *fields)) + "\n")
    return p


def claim(results_dir: str | Path, study: str, cells: list[str], pack_id: str) -> list[Path]:
    """The pack launcher's claim on its members (replacing Snakemake's pending one), in this process's name."""
    return [_write_claim(claim_path(results_dir, study, c), pack_id) for c in cells]


def claim_pending(results_dir: str | Path, study: str, cells: list[str], pack_id: str) -> list[Path]:
    """Snakemake's claim, before any job starts, on the members of a pack it will run: in its own process's name
    (alive while it runs), marked pending until the pack's launcher claims them itself. A cell that another live
    launcher holds is left alone."""
    claims = [claim_path(results_dir, study, c) for c in cells]
    return [_write_claim(p, pack_id, PENDING) for p in claims if not claim_alive(p)]


def _claim_fields(p: Path) -> list[str] | None:
    """pid, host, pack[, pending] of a claim (None: none there, or not a claim)."""
    try:
        fields = p.read_text().split()
    except OSError:
        return None
    return fields if len(fields) in (3, 4) and (len(fields) == 3 or fields[3] == PENDING) else None


def unclaim(claims: list[Path]) -> None:
    for p in claims:
        try:
            if p.read_text().split()[0] == str(os.getpid()):
                p.unlink()
        except (OSError, IndexError):
            pass


def claim_alive(p: Path) -> bool:
    """The claim exists and its holder (the pack's launcher, or Snakemake while it is pending) still runs (a dead
    holder's claim is ignored)."""
    fields = _claim_fields(p)
    if fields is None:
        return False
    if fields[1] != socket.gethostname():
        return True  # cannot check another host's process: the claim holds while it exists
    return pid_alive(fields[0])


def stale_holder(p: Path) -> list[str] | None:
    """The fields of a claim whose holder is gone (a process of this host no longer running); None otherwise."""
    fields = _claim_fields(p)
    if fields is None or fields[1] != socket.gethostname() or pid_alive(fields[0]):
        return None
    return fields


def clear_stale_claims(results_dir: str | Path, study: str, cells: list[str]) -> list[Path]:
    """Remove the stale claims of these cells (their holder was killed), each said in one line; the paths removed.
    Snakemake's ``onstart`` calls it before any job runs (workflow/rules/pack.smk)."""
    out = []
    for c in cells:
        p = claim_path(results_dir, study, c)
        if not p.exists() or (fields := stale_holder(p)) is None:
            continue
        p.unlink(missing_ok=True)
        print(f"[lorarl] {study}/{c}: removed a stale pack claim ({fields[2]}, holder process {fields[0]} is gone)",
              file=sys.stderr, flush=True)
        out.append(p)
    return out


def is_pending(p: Path) -> bool:
    """The claim is Snakemake's pending one: the pack's launcher has not claimed the cell yet."""
    fields = _claim_fields(p)
    return fields is not None and len(fields) == 4


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
    src = provenance.provenance_path(results_dir, study, f".packs/{pack_id}", "pack")
    dst = provenance.provenance_path(results_dir, study, cell, "train")
    dst.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(src.read_text()) if src.exists() else {}
    doc["packed"] = {"pack": pack_id, "members": summary["pack"].get("members", []), "record": str(src)}
    tmp = dst.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, dst)


def wait_and_publish(results_dir: str | Path, study: str, cell: str, config_hash: str, poll_s: float = 1.0) -> bool:
    """What a member's ``train`` launcher does first: True = a pack trained the cell and its outputs are
    now in place (nothing to submit); False = train it as usual."""
    p = claim_path(results_dir, study, cell)
    packs = paths.cell_dir(results_dir, study, ".packs")
    if not p.exists() and packs.is_dir():  # packing is used in this study: a pack launcher may be starting
        grace = float(os.environ.get(GRACE_ENV, "3"))
        deadline = time.time() + grace
        while time.time() < deadline and not p.exists():
            time.sleep(min(poll_s, 0.5))
    if (gone := stale_holder(p)) is not None:  # its holder was killed: nothing holds the cell
        print(f"[lorarl] train {cell}: ignoring the stale claim of pack {gone[2]} (holder process {gone[0]} is gone)",
              flush=True)
    pending_s = float(os.environ.get(PENDING_ENV, "300"))
    waited, pending_until = False, time.time() + pending_s
    staged = staged_dir(results_dir, study, cell) / "summary.json"
    while claim_alive(p) and _summary_hash(staged) != config_hash:  # a member staged (its last act) is published
        pack = (_claim_fields(p) or ["", "", "?"])[2]
        if not waited:
            print(f"[lorarl] train {cell}: its pack is training it ({pack}); waiting", flush=True)
            waited = True
        if is_pending(p) and time.time() > pending_until:
            print(f"[lorarl] train {cell}: its pack {pack} did not start in {pending_s:g} s; training it here",
                  flush=True)
            break
        time.sleep(poll_s)
    return publish(results_dir, study, cell, config_hash)
