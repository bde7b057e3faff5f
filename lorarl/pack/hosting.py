"""The hosting plan: for every unfinished cell of a study, who trains it and to which step, decided in one place.

    plan = hosting_plan(study, Runtime(max_cells=4), "results")   # cell id -> Host
    plan["r8-s0"]  # Host(kind='pack', job='pack-1a2b3c4d5e', step=200, segment=False, members=('r1-s0', 'r8-s0'))

A pure function of the study, the runtime config (packing: ``pack.max_cells``, resident ``pack.places``; the
search on or off) and the files on disk (finished cells, checkpoints, an adaptive study's decisions). Its readers
decide nothing again: workflow/rules/pack.smk plans its ``train_pack`` jobs from it (their ids, members and
``--until``), `lorarl doctor`'s projection plans the same jobs from it (lorarl.pipeline.doctor.jobs), and a
cell's own train job asks :func:`solo_host` (the one rule for a cell no pack holds) which engine trains it.

The hosts (``Host.kind``):

- ``solo``: the cell's own ``train`` job, TRL's GRPOTrainer (lorarl.train.main.train_cell);
- ``alone``: the cell's own ``train`` job as a pack of one (lorarl.pack.run.train_alone): a cell whose newest
  checkpoint is a pack's state resumes in the loop that wrote it (TRL cannot read it);
- ``pack``: a fixed pack of at most ``pack.max_cells`` compatible cells (lorarl.pack.plan.plan_packs), one job;
- ``resident``: a resident job with ``pack.places`` places over one compatible group, lengths aside
  (lorarl.pack.resident.plan_residents).

A vLLM pack or resident job that the measured pack-or-solo table (lorarl.pack.breakeven) says samples slower than
its members' solo engines is declined here, with a log line: its cells are hosted ``solo`` (a fixed pack's in
lorarl.pack.plan.plan_packs, a resident job's by :func:`lorarl.pack.plan.split_losing` at the adapters its engine
holds at once, ``min(places, members)``). The job itself decides nothing again.

``segment``: the cell trains up to a rung of an adaptive study's search and stops there (the job's ``--until``,
``step`` the rung; the cells whose next segment the decisions on disk allow now, :func:`segments_now`); otherwise
it trains to its end (``step`` = ``train.steps``). A cell of a search whose next segment waits on a decision, or
that the search stopped, is not in the plan (nothing of it trains now). A group of one compatible cell is no pack:
it is hosted ``solo`` (or ``alone``), and so is a cell holding a solo (TRL) checkpoint when packing is on (only
TRL resumes that state; lorarl.pack.run leaves such a cell out too, should one be written after the plan).
Finished cells are not in the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HOST_KINDS", "MEMBER_PRIORITY", "PACK_PRIORITY", "Host", "Runtime", "hosting_plan", "pack_jobs", "segments_now", "solo_host"]

HOST_KINDS = ("solo", "alone", "pack", "resident")  # who trains a cell (the module docstring says what each is)
PACK_PRIORITY = 100  # Snakemake `priority:` of a pack job: it starts before the members' train jobs that wait on it
MEMBER_PRIORITY = 50  # of a packed member's train job: before evaluations (0), so it publishes as soon as staged


@dataclass(frozen=True)
class Runtime:
    """The runtime choices that move hosts (never a cell's signature)."""

    max_cells: int = 1  # pack.max_cells: most cells per fixed pack (1: no packing)
    places: int = 0  # pack.places of resident jobs (0: fixed packs, or none)
    search_on: bool = True  # False under --config search=off: searched cells train to their end like any other


@dataclass(frozen=True)
class Host:
    """Who trains one cell now, and to which step."""

    kind: str  # one of HOST_KINDS
    job: str  # the job that trains it: the cell id (solo, alone), else the pack id (lorarl.pack.plan.pack_id)
    step: int  # the step it trains to: its rung (segment), else its train.steps
    segment: bool = False  # True: it stops at a rung of the search (the job's --until)
    members: tuple[str, ...] = ()  # pack, resident: every member of the job, in study order

    @property
    def until(self) -> int | None:
        """The job's ``--until``: the rung of a segment, None to the end."""
        return self.step if self.segment else None

    @property
    def packed(self) -> bool:
        return self.kind in ("pack", "resident")


def solo_host(results_dir: str | Path, study: str, cell: Any, step: int | None = None) -> Host:
    """The host of a cell no pack holds: ``alone`` when the state it would resume from is a pack's (the loop that
    wrote it resumes it), else ``solo`` (TRL). ``step``: a rung it stops at (None: its end). Read from disk now:
    the plan asks it at parse time, the cell's train job again when it starts (a pack killed in between leaves
    its state behind)."""
    from lorarl.train.cellstate import waiting_engine

    kind = "alone" if waiting_engine(results_dir, study, cell) == "pack" else "solo"
    end = int(cell.config.train.steps)
    return Host(kind, cell.id, end if step is None else int(step), step is not None)


def segments_now(study: Any, table: Any, results_dir: str | Path) -> dict[str, int | None]:
    """Cells of an adaptive study's search whose next training job the decisions on disk allow now: cell -> the
    rung it trains to (None: to its end). Empty for a study without a search. Nothing is written."""
    from lorarl import paths
    from lorarl.adaptive import ledger
    from lorarl.adaptive.halving import decide
    from lorarl.adaptive.records import rung_records
    from lorarl.language.adaptive.settings import study_settings
    from lorarl.language.adaptive.blocks import resolved_search
    from lorarl.io import read_json

    if getattr(study, "search", None) is None:
        return {}
    res = str(results_dir)
    spec = resolved_search(study, table)
    settings = study_settings(study, table, spec.paired)
    records = rung_records(res, study.name, table.cells, spec.metric, spec.rungs)
    led = decide(spec, settings, records, ledger.read(ledger.search_path(res, study.name)))
    out: dict[str, int | None] = {}
    for cid, p in ledger.cell_plan(led, {c.id: c.config.train.steps for c in table.cells}).items():
        kw = dict(results=res, study=study.name, cell=cid)
        h = table.cell(cid).hash
        if p["state"] == "running":
            mark = read_json(paths.path("rung_mark", step=p["until"], **kw))
            if not (isinstance(mark, dict) and mark.get("config_hash") == h):
                out[cid] = p["until"]
        elif p["state"] == "finishing":
            done = read_json(paths.path("summary", **kw))
            if not (isinstance(done, dict) and done.get("config_hash") == h):
                out[cid] = None
    return out


def _searched(study: Any, table: Any, runtime: Runtime) -> set[str]:
    """The cells the search decides (none when it is off or the study has none)."""
    if not runtime.search_on or getattr(study, "search", None) is None:
        return set()
    from lorarl.language.adaptive.settings import study_settings
    from lorarl.language.adaptive.blocks import resolved_search

    spec = resolved_search(study, table)
    return {c for s in study_settings(study, table, spec.paired) for c in s.cells}


def hosting_plan(study: Any, runtime: Runtime, results_dir: str | Path, table: Any = None) -> dict[str, Host]:
    """Cell id -> its Host, for every cell that trains now (study order). ``table``: the study's cell table when
    the caller holds it (else built here)."""
    from lorarl.language.kinds import get_kind
    from lorarl.pack.plan import pack_id, split_losing
    from lorarl.pack.publish import unfinished
    from lorarl.pack.resident import plan_pack_jobs
    from lorarl.language.study import cell_table
    from lorarl.train.cellstate import waiting_engine

    if "train" not in get_kind(study.kind).cell_stages:
        return {}
    table = cell_table(study) if table is None else table
    res = str(results_dir)
    searched = _searched(study, table, runtime)
    segments = segments_now(study, table, res) if searched else {}
    groups: dict[int | None, list[Any]] = {}  # the rung the cells train to (None: their end) -> cells, study order
    for c in table.cells:
        if c.id in searched:
            if c.id in segments:
                groups.setdefault(segments[c.id], []).append(c)
        elif unfinished(res, study.name, c.id, c.hash):
            groups.setdefault(None, []).append(c)
    packing = runtime.max_cells > 1 or bool(runtime.places)
    by = {c.id: c for c in table.cells}
    out: dict[str, Host] = {}
    for until, cells in groups.items():
        if packing:  # a cell holding TRL's own checkpoint resumes in its own job (a pack cannot read that state)
            alone = [[c.id] for c in cells if waiting_engine(res, study.name, c) == "hf"]
            cells = [c for c in cells if [c.id] not in alone]
        jobs = plan_pack_jobs(cells, runtime.max_cells, runtime.places) + alone if packing else [[c.id] for c in cells]
        if runtime.places:  # plan_packs's rule for fixed packs, here for resident jobs: decided once, in this plan
            jobs = split_losing(jobs, cells, True, runtime.places)  # a losing vLLM job: its cells solo, said in the log
        for members in jobs:
            if len(members) == 1:
                out[members[0]] = solo_host(res, study.name, by[members[0]], until)
                continue
            kind = "resident" if runtime.places else "pack"
            pid = pack_id(members, until=until, resident=kind == "resident")
            for m in members:
                step = int(by[m].config.train.steps) if until is None else int(until)
                out[m] = Host(kind, pid, step, until is not None, tuple(members))
    return {c.id: out[c.id] for c in table.cells if c.id in out}


def pack_jobs(plan: dict[str, Host]) -> dict[str, Host]:
    """Pack id -> the Host of its members (pack and resident jobs only), in plan order."""
    return {h.job: h for h in plan.values() if h.packed}
