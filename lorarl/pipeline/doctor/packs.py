"""Pack-steps of a study's training jobs, for `lorarl doctor`'s projection: resident packs against fixed packs.

A pack takes one step for all its members at once, so a job runs as many *pack-steps* as its pack takes: the
device time where a step costs the same however many places are filled (an under-filled GPU), independent of the
machine. A fixed pack (``pack: {max_cells: K}``, lorarl.pack.plan.plan_packs) runs as long as its longest member
(:func:`fixed_pack_steps`). A resident job with P places (lorarl.pack.resident.train_resident) takes its group's
cells in study order and gives a freed place to the next waiting cell (:func:`resident_schedule`: list scheduling,
every member at its configured ``train.steps``; collapse stops, divergence and adaptive rungs, which free places
earlier, are not foreseen). The hours of the projection (lorarl.pipeline.doctor.projection) keep their own
convention, the members' steps one after another in one job; these counts stand beside them.
"""

from __future__ import annotations

import heapq
from typing import Any


def fixed_pack_steps(packs: list[list[int]]) -> int:
    """Pack-steps of fixed packs, each given as its members' ``train.steps``: each runs as long as its longest."""
    return sum(max(p) for p in packs if p)


def resident_schedule(steps: list[int], places: int) -> tuple[int, int]:
    """(pack-steps, packs formed) of one resident job whose members (in study order) train ``steps`` each on
    ``places`` places: the first ``places`` cells start together; at a step where members end while cells wait, the
    pack is re-formed and each freed place takes the next waiting cell; the job ends with its last member."""
    if isinstance(places, bool) or not isinstance(places, int) or places < 1:
        raise ValueError(f"places must be an integer >= 1; got {places!r}")
    ends: list[int] = []  # end step of each member in a place
    queue = list(steps)
    now = formed = 0
    while queue or ends:
        if queue and len(ends) < places:  # a (re-)formed pack: the freed places take the next waiting cells
            formed += 1
            while queue and len(ends) < places:
                heapq.heappush(ends, now + queue.pop(0))
        now = heapq.heappop(ends)
        while ends and ends[0] == now:  # members that end at the same step free their places together
            heapq.heappop(ends)
    return now, formed


def pack_steps(cells: list[Any], jobs: list[Any], max_cells: int, places: int) -> dict[str, Any] | None:
    """The pack-steps of the planned training jobs (lorarl.pipeline.doctor.jobs.planned_jobs with this ``pack``
    setting) against fixed packs of the same cells (at most ``max_cells``, or ``places`` when only those are set)
    and solo cells; None when packing is off. ``cells``: the study's cells, in study order."""
    from lorarl.pack.plan import plan_packs

    if not places and max_cells <= 1:
        return None
    steps = {c.id: int(c.config.train.steps) for c in cells}
    trained = {j.cell for j in jobs if j.kind in ("train", "publish")}
    by = {c.id: c for c in cells}
    width = max_cells if max_cells > 1 else places

    def fixed(ids: list[str]) -> int:
        return fixed_pack_steps([[steps[m] for m in p] for p in plan_packs([by[i] for i in ids], width)])

    rows = []
    for j in jobs:
        if j.kind != "pack":
            continue
        members = j.target.split(",")
        lengths = [steps[m] for m in members]
        own, formed = resident_schedule(lengths, places) if places else (max(lengths), 1)
        rows.append({"job": j.cell, "members": len(members), "pack_steps": own, "packs_formed": formed,
                     "fixed_pack_steps": fixed(members)})
    alone = sum(steps[j.cell] for j in jobs if j.kind == "train")  # a cell that packs with no other: its own job
    todo = [c.id for c in cells if c.id in trained]
    return {"resident": bool(places), "places": places, "max_cells": width, "jobs": rows,
            "pack_steps": sum(r["pack_steps"] for r in rows) + alone, "fixed_pack_steps": fixed(todo),
            "solo_steps": sum(steps[c] for c in todo)}


def places_refused(cells: list[Any], jobs: list[Any], places: int, gpu_memory_gb: float) -> list[str]:
    """What each planned resident job would refuse at its start on a GPU of ``gpu_memory_gb`` (the memory plan's
    check, lorarl.pack.resident.check_places): one message per job whose places do not fit; none on a CPU (0)."""
    from lorarl.pack.resident import check_places

    by = {c.id: c for c in cells}
    out = []
    for j in jobs:
        if j.kind == "pack" and places and gpu_memory_gb:
            try:
                check_places(places, [by[m].config for m in j.target.split(",")], gpu_memory_gb=gpu_memory_gb)
            except ValueError as err:
                out.append(f"{j.cell}: {err}")
    return out


def places_check(projection: dict[str, Any], device_kind: str) -> dict[str, Any] | None:
    """The report's check of the resident places against the memory plan on the doctor's GPU (None: no resident
    packs, or a CPU, where the job checks nothing)."""
    if not projection.get("pack_places") or device_kind != "cuda":
        return None
    refused = projection.get("places_refused") or []
    return {"check": "resident places fit the GPU (memory plan)", "ok": not refused, "seconds": 0.0,
            "detail": "; ".join(refused) or f"{projection['pack_places']} places in each resident job"}


def describe(p: dict[str, Any] | None) -> str:
    """One line of the report: the pack setting, its jobs and their pack-steps against fixed packs and solo cells."""
    if not p:
        return ""
    n = len(p["jobs"])
    if not p["resident"]:
        return (f"Fixed packs of at most {p['max_cells']}: {n} train_pack job{'s' * (n != 1)}, "
                f"{p['pack_steps']} pack-steps ({p['solo_steps']} steps as solo cells).")
    formed = sum(r["packs_formed"] for r in p["jobs"])
    ratio = f", {p['pack_steps'] / p['fixed_pack_steps']:.2f}x" if p["fixed_pack_steps"] else ""
    return (f"Resident packs, {p['places']} places: {n} train_pack job{'s' * (n != 1)} ({formed} packs formed); "
            f"**{p['pack_steps']} pack-steps resident against {p['fixed_pack_steps']} in fixed packs of "
            f"{p['max_cells']}**{ratio} ({p['solo_steps']} steps as solo cells): the steps the jobs run, what a device "
            "pays whose step costs the same however many places are filled; the hours above count each member's "
            "steps one after another.")
