"""Resident packs: one job per compatible group of cells holds K places and admits the next waiting cell when
a place frees (a member finishes, collapses under ``train.stop_on_collapse``, diverges, or pauses at its rung).

    train_resident("demo", cells, results_dir="results", places=4, resident_id="pack-1a2b3c4d5e")

A runtime choice (``pack: {max_cells: K, resident: true, places: P}`` in the Snakemake config), never part of a
cell's signature. The group is every unfinished cell with the same :func:`resident_key` (the pack key without
``train.steps``: members of different lengths share a job, each leaving at its own end). The host is the pack's
(:func:`lorarl.pack.run.train_members`, one :class:`lorarl.train.cellrun.CellRun` per member, which owns the member's
bookkeeping); this module decides who sits in the places:

1. claim up to ``places`` cells, in order: first the members this job paused at a slot boundary, then the
   waiting cells. A claim is the cell's own lock (lorarl.train.checkpoint, fcntl): a cell finished, staged,
   holding a solo (TRL) checkpoint, or trained by another job is skipped, so two jobs never train one cell;
2. train them as one pack until a step in which a member leaves while a cell still waits: at that step every
   member still running pauses with its full state (``CellRun.end_step(..., pause=True)``; lorarl.train.cellstate),
   and the pack is re-formed from them and the next waiting cell. A paused member comes back equal to its
   uninterrupted run (tests/train/test_cell_leaves.py); nothing is shared between members but the frozen base;
3. a member ending paused at the job's rung (``stop_at``: an adaptive study's rung, the job's ``--until``, or stopped
   there by the search) leaves for good: its place goes to the next waiting cell.

Each member's outputs are staged for its own ``train`` job (lorarl.pack.publish), as a fixed pack's. The job's
admissions go to ``results/<study>/.packs/<id>.ledger.json`` as they happen (atomic writes; each segment carries the
``run`` of the job's process that formed it: a requeued or rerun job appends to the earlier processes'); its record
``<id>.json`` is written at the end. A SIGKILL loses each member's steps since its last checkpoint
(``train.checkpoint_every``; the slot-boundary pauses are checkpoints too); the rerun resumes every member.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.io import write_json
from lorarl.pack import run as packrun
from lorarl.pack.plan import pack_key, plan_packs

def resident_key(cfg: Any) -> str | None:
    """Cells that may share a resident job: the pack key, lengths aside (None: the cell cannot pack)."""
    return pack_key(cfg, lengths=False)


def plan_residents(cells: list[Any]) -> list[list[str]]:
    """Cell ids grouped into resident jobs (one per compatible group, in study order); unpackable cells alone."""
    groups: dict[str, list[str]] = {}
    out: list[list[str]] = []
    for c in cells:
        key = resident_key(c.config)
        if key is None:
            out.append([c.id])
        elif key not in groups:
            groups[key] = [c.id]
            out.append(groups[key])
        else:
            groups[key].append(c.id)
    return out


def plan_pack_jobs(cells: list[Any], max_cells: int, places: int) -> list[list[str]]:
    """The training jobs of a study's unfinished cells (in study order) as workflow/rules/pack.smk plans them:
    with ``places`` (resident packs) one per compatible group, else fixed packs of at most ``max_cells``; a group
    of one cell trains alone (its own ``train`` job). Also the doctor's plan (lorarl.pipeline.doctor.jobs)."""
    return plan_residents(cells) if places else plan_packs(cells, max_cells)


def check_places(places: Any, cfgs: list[Any], gpu_memory_gb: float | None = None) -> int:
    """``places`` as an integer >= 1 that the memory plan admits on a GPU of ``gpu_memory_gb`` (None: the job's own
    GPU when it has one; no check on a CPU). Raises ValueError naming the field and the allowed values."""
    if isinstance(places, bool) or not isinstance(places, int) or places < 1:
        raise ValueError(f"pack.places must be an integer >= 1 (the cells a resident job holds at once); got {places!r}; "
                         "allowed: a whole number >= 1")
    if gpu_memory_gb is None:
        gpu_memory_gb = _gpu_memory_gb()
    if gpu_memory_gb:
        from lorarl.memory.resident import admitted_places

        most, peak = admitted_places(cfgs, gpu_memory_gb, places)
        if places > most:
            allowed = (f"1..{most}" if most else "none: not one member fits beside the shared base; train these "
                       "cells without resident packs (pack: 1), or on a larger GPU (pack.gpu_memory_gb)")
            raise ValueError(f"pack.places = {places}: the memory plan admits at most {most} places on a "
                             f"{gpu_memory_gb:g} GiB GPU (the largest {places}-member mix peaks at {peak:.1f} GiB); "
                             f"allowed: {allowed}")
    return places


def host_gpu_memory_gb() -> float | None:
    """The smallest GPU of this host in GiB, from ``nvidia-smi`` (no torch: the Snakefile's parse stays light);
    None without one. What the local launcher's pack jobs run on (workflow/rules/pack.smk checks their places)."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30).stdout
        mib = [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()]
    except (OSError, subprocess.SubprocessError):
        return None
    return min(mib) / 1024 if mib else None


def _gpu_memory_gb() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30


def train_resident(study: str, cells: list[Any], results_dir: str | Path = "results", places: int = 4,
                   threads: int | None = None, resident_id: str = "resident", stop_at: int | None = None,
                   update_cells: int | None = None) -> dict:
    """Train ``cells`` (one compatible group) through ``places`` places; stage each member's outputs; the record.
    One process: in a job of several ranks, rank 0 hosts every place (the others return at once)."""
    from lorarl.pack import ranks
    from lorarl.pack.build import Door  # torch: the job's, not the Snakefile's (plan_pack_jobs above)

    rank, world = ranks.world()
    if rank > 0:
        return {"pack": resident_id, "rank": rank, "trained": [], "left_out": {}, "states": {}, "outcomes": {}}
    if world > 1:
        ranks.one_process()  # rank 0 alone: a one-process job (its vLLM engine too)
    try:
        places = check_places(places, [c.config for c in cells])  # before anything is claimed or written
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if cells and cells[0].config.rollout.engine == "vllm":
        engine_for(cells, places, results_dir)  # one multi-LoRA engine with `places` slots, kept for every re-form
    t0 = time.time()
    door = Door()  # the base, reference, data and regimes: loaded by the first pack, kept for every re-form
    queue, carried, ledger = list(cells), [], []
    folder = paths.cell_dir(results_dir, study, paths.PACKS)
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / f"{resident_id}.ledger.json"
    earlier = _earlier_segments(record)  # a requeued or rerun job keeps its earlier processes' admissions
    run = 1 + max((s.get("run", 0) for s in earlier), default=-1)
    outcomes: dict[str, dict] = {}
    left_out: dict[str, str] = {}
    info = {"id": resident_id, "members": [c.id for c in cells], "resident": places}
    while True:
        t_seg = time.time()
        members: list[Any] = []
        while len(members) < places and (carried or queue):
            c = carried.pop(0) if carried else queue.pop(0)
            got, out = packrun.claim_members(study, [c], results_dir, resident_id, t_seg, stop_at)
            members += got
            left_out.update({k: v for k, v in out.items() if k not in outcomes})
        if not members:
            break
        ledger.append({"admitted": [p.cell.id for p in members], "time": round(t_seg - t0, 2), "run": run})
        write_json(record, {"places": places, "segments": earlier + ledger})

        def waiting() -> bool:
            return bool(queue)

        summaries = packrun.train_members(study, members, results_dir, threads, info, t_seg, boundary=waiting,
                                          door=door, update_cells=update_cells)
        by_id = {p.cell.id: p.cell for p in members}
        for cid, s in summaries.items():
            at = s.get("paused_at_step")
            if s.get("state") == "paused" and (stop_at is None or at is None or at < stop_at):
                carried.append(by_id[cid])  # paused at the slot boundary: back in the next pack
            else:
                outcomes[cid] = {k: s[k] for k in packrun.OUTCOME if k in s}
        ledger[-1]["left"] = sorted(outcomes.keys() & set(by_id))
        write_json(record, {"places": places, "segments": earlier + ledger})
    out = {"pack": resident_id, "study": study, "resident": places,
           "trained": sorted(c for c, o in outcomes.items() if o.get("state") != "paused"),
           "left_out": left_out, "states": {c: o["state"] for c, o in outcomes.items()}, "outcomes": outcomes,
           "segments": len(ledger), "base_loads": door.loads, "wall_time_s": round(time.time() - t0, 2)}
    write_json(folder / f"{resident_id}.json", out)
    return out


def _earlier_segments(record: Path) -> list[dict]:
    """The segments an earlier process of this job wrote (requeued, or rerun after a kill); [] if none or unreadable."""
    import json

    try:
        return list(json.loads(record.read_text()).get("segments", []))
    except (OSError, ValueError, AttributeError):
        return []


def engine_for(cells: list[Any], places: int, results_dir: str | Path) -> Any:
    """``rollout.engine: vllm``: the process's multi-LoRA engine with ``max_loras = places`` and the group's largest
    saved rank (a residual init is saved at rank 2r), built once; every re-formed pack reuses it
    (lorarl.pack.vllm_rollouts.pack_engine), evicting the adapters of members that left and admitting the new ones
    (lorarl.pack.multilora.EngineAdapters) without restarting the engine."""
    from lorarl.adapters.names import RESIDUAL_INITS
    from lorarl.evaluate.vllm_backend import _vllm_api
    from lorarl.models import resolve_model
    from lorarl.pack.multilora import engine_lora_kwargs
    from lorarl.pack.vllm_rollouts import engine_args, pack_engine

    ranks = [c.config.adapter.rank * (2 if c.config.adapter.init in RESIDUAL_INITS else 1) for c in cells]
    lora = engine_lora_kwargs([max(ranks)] * min(places, len(cells)))
    cfg = cells[0].config
    return pack_engine(_vllm_api(), resolve_model(cfg.model, results_dir), engine_args(cfg, lora))

