"""The stages a job can run, by name: what `lorarl launch <stage>` submits and `lorarl run --stages`
runs in-process. Each stage is one small function registered here (`@register_stage`); it imports
its stage package only when the job runs, so the launcher stays light. Adding a stage is one
function here plus its Snakemake rule.

A stage's target (the `cell` argument of `lorarl launch`) is a cell id, a comma list of cell ids
(`pack`, `toy`: "all" or a list) or a local model recipe (`base`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from lorarl.pipeline.jobparams import JobParams


@dataclass
class Job:
    """What a stage function gets: the study file, the target, where results go, CPU threads, the job's parameters."""

    study_path: str  # the study YAML ("-" for `base`)
    target: str  # cell id, comma list, "all", or a recipe name (see the module doc)
    results_dir: str  # results root
    threads: int | None  # CPU threads of the job (OMP_NUM_THREADS is set by the launcher)
    params: JobParams = field(default_factory=JobParams)  # its command line's job parameters (lorarl.pipeline.jobparams)
    _study: Any = None
    _table: Any = None

    @property
    def study(self) -> Any:
        if self._study is None:
            from lorarl.study import load_study

            self._study = load_study(self.study_path)
        return self._study

    @property
    def table(self) -> Any:
        if self._table is None:
            from lorarl.study import cell_table

            self._table = cell_table(self.study)
        return self._table

    def cell(self) -> Any:
        return self.table.cell(self.target)


@dataclass(frozen=True)
class Stage:
    name: str  # `lorarl launch <name>`, Snakemake's `stage` param
    run: Callable[[Job], dict]  # runs the stage in this process; returns a small summary
    summary: str  # one line for --help
    launchable: bool = True  # offered by `lorarl launch` (doctor runs its own jobs)


STAGES: dict[str, Stage] = {}


def register_stage(name: str, summary: str, launchable: bool = True) -> Callable[[Callable[[Job], dict]], Callable]:
    def deco(fn: Callable[[Job], dict]) -> Callable[[Job], dict]:
        if name in STAGES:
            raise ValueError(f"stage {name!r} registered twice")
        STAGES[name] = Stage(name, fn, summary, launchable)
        return fn
    return deco


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; allowed: {', '.join(STAGES)}")
    return STAGES[name]


def launchable() -> list[str]:
    return [s.name for s in STAGES.values() if s.launchable]


@register_stage("base", "build a local base model from its recipe (target: the recipe name)")
def _base(job: Job) -> dict:
    from lorarl.models import build_base, resolve_model

    return build_base(job.target, resolve_model(f"local:{job.target}", job.results_dir), threads=job.threads)


@register_stage("train", "GRPO training of one cell (resumes from its last complete checkpoint)")
def _train(job: Job) -> dict:
    from lorarl.memory.auto import resolve_job
    from lorarl.train import ranks, until
    from lorarl.train.cellstate import waiting_engine
    from lorarl.train.main import train_cell

    cell, study = job.cell(), job.study.name  # resources resolved here, where the job starts
    rung = job.params.until  # an adaptive study's rung job (`--until`): the run pauses there
    out = until.already_ended(job.results_dir, study, cell) if rung is not None else None  # finished: a mark only
    if out is None and waiting_engine(job.results_dir, study, cell) == "pack":  # a pack's state: a pack of one
        from lorarl.pack.run import train_alone

        out = train_alone(study, cell, job.results_dir, threads=job.threads, stop_at=rung)
    elif out is None:
        config = resolve_job(cell.config, results_dir=str(job.results_dir))  # the trainer gets a resolved config
        out = train_cell(study, cell, job.results_dir, threads=job.threads, config=config, stop_at=rung,
                         invocation=job.params.invocation)
    if rung is None or not ranks.is_main():
        return out
    return until.write_mark(job.results_dir, study, cell, rung, **until.mark_fields(out))  # the rung job's output, last


@register_stage("evaluate", "held-out evaluation of one cell or base pseudo-cell (`--eval-target`)")
def _evaluate(job: Job) -> dict:
    from lorarl.evaluate.main import evaluate_cell

    cell = job.cell()
    targets = [t for t in job.params.eval_target.split(",") if t.strip()] or None  # none: all of the cell's
    return evaluate_cell(job.study.name, cell, job.results_dir, is_base=job.table.is_base(cell.id),
                         threads=job.threads, targets=targets)


@register_stage("diagnose", "weight-space diagnostics of one trained cell")
def _diagnose(job: Job) -> dict:
    from lorarl.diagnose.main import diagnose_cell

    return diagnose_cell(job.study.name, job.cell(), job.results_dir, threads=job.threads)


@register_stage("toy", "every cell of a toy KL-bound study in one job (target: all, or a comma list)")
def _toy(job: Job) -> dict:
    from lorarl.toy.cells import run_toy_study

    ids = None if job.target == "all" else job.target.split(",")
    return {"cells": len(run_toy_study(job.study, job.results_dir, ids))}


@register_stage("pack", "the member cells of one pack trained in one job (target: a comma list)")
def _pack(job: Job) -> dict:
    from lorarl.pack import resident
    from lorarl.pack.plan import pack_id
    from lorarl.pack.run import train_pack

    from lorarl.pack.ranks import world
    from lorarl.train import until

    ids, study = job.target.split(","), job.study.name
    rung = job.params.until  # a rung's pack (`--until`): every member pauses there
    cells = [job.table.cell(c) for c in ids]
    places = job.params.places  # a resident job (`--places`): its places, else a fixed pack
    chunk = job.params.update_cells  # pack.update_cells (`--update-cells`, a memory knob): None, all at once
    if places:
        out = resident.train_resident(study, cells, job.results_dir, places, threads=job.threads,
                                      resident_id=pack_id(ids, resident=True), stop_at=rung, update_cells=chunk)
    else:
        out = train_pack(study, cells, job.results_dir, threads=job.threads, pack_id=pack_id(ids), stop_at=rung,
                         update_cells=chunk)
    if rung is not None and world()[0] == 0:  # rank 0 holds every rank's outcome: each member's mark, staged
        for c in cells:
            if c.id in out["outcomes"]:  # trained (or paused) here; a member left out: its own rung job trains it
                until.write_mark(job.results_dir, study, c, rung, staged=True, **until.mark_fields(out["outcomes"][c.id]))
        from lorarl import paths
        from lorarl.io import write_json

        # the rule's output: a rung's pack is named with its rung (workflow/rules/pack.smk), its record too
        write_json(paths.path("pack_done", results=str(job.results_dir), study=study,
                              pack=pack_id(ids, until=rung, resident=bool(places))), out)
    return out


@register_stage("doctor", "checks + a smoke run of one cell (lorarl doctor submits it)", launchable=False)
def _doctor(job: Job) -> dict:
    from lorarl.pipeline.doctor import doctor_job

    return doctor_job(job.study_path, job.cell().id, job.results_dir, threads=job.threads)
