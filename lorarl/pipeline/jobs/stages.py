"""The stages a job can run, by name: what `lorarl launch <stage>` submits and `lorarl run --stages`
runs in-process. Each stage is one small function registered here (`@register_stage`); it imports
its stage package only when the job runs, so the launcher stays light. Its entry carries every fact
the launcher, the in-flight check, the out-of-memory retries and the workflow ask about it (its
declared outputs, log key, OOM ladder, Slurm resources key, ...): no `stage == "..."` test elsewhere
(tests/project/test_structure.py). Adding a stage is one function here plus its Snakemake rule. A stage of a package
above the launcher registers itself in its own module (the doctor's: lorarl.pipeline.doctor.stage); the job
imports the module that registered its stage (:func:`stage_module`), so the launcher never imports it.

A stage's target (the `cell` argument of `lorarl launch`) is a cell id, a comma list of cell ids
(`pack`, `toy`: "all" or a list) or a local model recipe (`base`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lorarl.pipeline.jobs.jobparams import JobParams


@dataclass
class Job:
    """What a stage function gets: the study file, the target, where results go, CPU threads, the job's parameters."""

    study_path: str  # the study YAML ("-" for `base`)
    target: str  # cell id, comma list, "all", or a recipe name (see the module doc)
    results_dir: str  # results root
    threads: int | None  # CPU threads of the job (OMP_NUM_THREADS is set by the launcher)
    params: JobParams = field(default_factory=JobParams)  # its command line's job parameters (lorarl.pipeline.jobs.jobparams)
    _study: Any = None
    _table: Any = None

    @property
    def study(self) -> Any:
        if self._study is None:
            from lorarl.language.study import load_study

            self._study = load_study(self.study_path)
        return self._study

    @property
    def table(self) -> Any:
        if self._table is None:
            from lorarl.language.study import cell_table

            self._table = cell_table(self.study)
        return self._table

    def cell(self) -> Any:
        return self.table.cell(self.target)


Outputs = Callable[[str, "str | None", str, JobParams], "list[Path]"]  # (results, study, target, params) -> paths


def no_outputs(results_dir: str, study: str | None, target: str, params: JobParams) -> list[Path]:
    """A stage whose jobs declare no output of their own (toy: checked by its aggregate)."""
    return []


@dataclass(frozen=True)
class Timing:
    """How `lorarl doctor`'s projection (lorarl.pipeline.doctor.costs) and `lorarl status --watch`'s ETA
    (lorarl.pipeline.progress.eta) time a planned job of a stage, or of a kind the doctor plans that runs none
    (lorarl.pipeline.doctor.jobs.OWN_KINDS)."""

    cost: str = ""  # the doctor's measured part its work is (lorarl.pipeline.doctor.costs.WORK); "": not measured
    by_steps: bool = False  # a start-up plus its one cell's optimiser updates: the ETA counts the steps left
    mean_timed: bool = True  # the ETA may charge it this run's mean finished job of its kind (False: its size varies)
    of_cell: bool = False  # it ends its cell's training: a failed cell's is not run again, nor the jobs after it
    keeps_going: bool = False  # it runs when a job it waits for failed (on what finished): never dropped by the ETA


@dataclass(frozen=True)
class Stage:
    name: str  # `lorarl launch <name>`, Snakemake's `stage` param
    run: Callable[[Job], dict]  # runs the stage in this process; returns a small summary
    summary: str  # one line for --help
    launchable: bool = True  # offered by `lorarl launch` (doctor runs its own jobs)
    outputs: Outputs = no_outputs  # its job's declared outputs (the rules' paths): a job without them failed (inflight)
    hashed_output: bool = False  # its first output records the cell's config_hash: another config's is not done
    key_param: str = ""  # the job parameter that tells its jobs of one cell apart: log folder, provenance "<stage>-<value>"
    oom_retry: str = ""  # the memory ladder an out-of-memory retry steps down ("train", "eval"); "": never retried
    resources_key: str = ""  # the profile's `slurm.<key>` its jobs get (a pack: train's); "": none
    for_study: bool = True  # False: the target is a model recipe, no study (logs, provenance: results/models/.logs)
    log_cell: str = ""  # its logs' and provenance's folder when its target is no one cell (no config hash): toy's .toy
    trains: bool = False  # trains cells: one process per rank of a multi-rank layout; a failed job's MLflow runs closed
    cell_layout: bool = False  # its one cell's training layout (layouts.on_oom at the last retry); skipped once packed
    members: bool = False  # the target: cells trained alone in one job (claims, a rank's GPU, staged .packed/ summaries)
    scratch: str = ""  # the folder under the cell it writes before moving outputs in: removed after a full disk
    rule: str = ""  # the Snakemake rule that runs its jobs (workflow/rules; the job-stats table's name): the doctor's job plan
    rule_threads: int = 1  # that rule's `threads:` (a local profile's cores are shared by them: the doctor's schedule)
    step_rule: str = ""  # the rule of a job for one snapshot step (target `<benchmark>@<step>`), if another
    rung_rule: str = ""  # the rule of a job that trains up to an adaptive study's rung, if another
    work: str = "other"  # the cost ledger's phase for its run where no finer timer took it (lorarl.ledger.PHASES)
    timing: Timing = Timing()  # how the doctor's projection and the watch's ETA time its job (a planned job's kind)


STAGES: dict[str, Stage] = {}


def register_stage(name: str, summary: str, launchable: bool = True, **facts: Any
                   ) -> Callable[[Callable[[Job], dict]], Callable]:
    """``facts``: the Stage fields past ``launchable`` (outputs, oom_retry, resources_key, ...)."""
    def deco(fn: Callable[[Job], dict]) -> Callable[[Job], dict]:
        if name in STAGES:
            raise ValueError(f"stage {name!r} registered twice")
        STAGES[name] = Stage(name, fn, summary, launchable, **facts)
        return fn
    return deco


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; allowed: {', '.join(STAGES)}")
    return STAGES[name]


def stage_module(name: str) -> str:
    """The module that registered the stage: a job imports it before asking for its stage, so a stage registered
    above the launcher (the doctor's) is there in the job's process too."""
    return get_stage(name).run.__module__


def launchable() -> list[str]:
    return [s.name for s in STAGES.values() if s.launchable]


def resources_keys() -> list[str]:
    """The profile's `slurm:` sections the stages' jobs read (the workflow hands each job its own)."""
    return list(dict.fromkeys(s.resources_key for s in STAGES.values() if s.resources_key))


def stage_of_record(stem: str) -> str:
    """The stage a provenance record (``<log key>.json``) is of: ``evaluate-math500@20`` -> evaluate."""
    return next((s.name for s in STAGES.values() if s.key_param and stem.startswith(f"{s.name}-")), stem)


def log_key(stage: str, params: JobParams) -> str:
    """train | base | evaluate[-<benchmark>[@step]]: one log folder and provenance file per job of a cell."""
    spec = get_stage(stage)
    value = getattr(params, spec.key_param) if spec.key_param else ""
    return f"{stage}-{value}" if value else stage


# ---- the stages' declared outputs (the Snakemake rules use the same paths) -------------------------

def _train_outputs(results_dir: str, study: str | None, cell: str, params: JobParams) -> list[Path]:
    from lorarl import paths
    from lorarl.pipeline.jobs.rung_jobs import expected

    kw = dict(results=results_dir, study=study, cell=cell)
    return expected(results_dir, study, cell, params.until) or [paths.path(k, **kw) for k in ("summary", "metrics",
                                                                                               "cell_json", "adapter")]


def _evaluate_outputs(results_dir: str, study: str | None, cell: str, params: JobParams) -> list[Path]:
    from lorarl import paths
    from lorarl.language.evalplan.plan import parse_target

    target, kw = params.eval_target, dict(results=results_dir, study=study, cell=cell)
    if not target:  # `lorarl launch evaluate` by hand: every target of the cell, not one file
        return []
    bench, step = parse_target(target)
    if step is None:
        return [paths.path("eval_summary", benchmark=bench, **kw), paths.path("eval_samples", benchmark=bench, **kw)]
    return [paths.path("eval_step_summary", benchmark=bench, step=step, **kw),
            paths.path("eval_step_samples", benchmark=bench, step=step, **kw)]


def _diagnose_outputs(results_dir: str, study: str | None, cell: str, params: JobParams) -> list[Path]:
    from lorarl import paths

    return [paths.path("diagnostics", results=results_dir, study=study, cell=cell)]


def _pack_outputs(results_dir: str, study: str | None, pack: str, params: JobParams) -> list[Path]:
    from lorarl import paths

    return [paths.path("pack_done", results=results_dir, study=study, pack=pack)]  # target: the pack id


def _base_outputs(results_dir: str, study: str | None, name: str, params: JobParams) -> list[Path]:
    from lorarl import paths

    return [paths.path("base_model", results=results_dir, name=name)]


@register_stage("base", "build a local base model from its recipe (target: the recipe name)", outputs=_base_outputs,
                resources_key="base", for_study=False, rule="base_model", rule_threads=2, work="update",  # SFT warm start
                timing=Timing(cost="build"))
def _base(job: Job) -> dict:
    from lorarl.models import build_base, resolve_model

    return build_base(job.target, resolve_model(f"local:{job.target}", job.results_dir), threads=job.threads)


@register_stage("train", "GRPO training of one cell (resumes from its last complete checkpoint)", outputs=_train_outputs,
                hashed_output=True, oom_retry="train", resources_key="train", trains=True, cell_layout=True,
                scratch=".train.tmp", rule="train", rung_rule="train_rung",
                timing=Timing(cost="training", by_steps=True, mean_timed=False, of_cell=True))
def _train(job: Job) -> dict:
    from lorarl.memory.auto import resolve_job
    from lorarl.pack.hosting import solo_host
    from lorarl.train import ranks, until
    from lorarl.train.main import train_cell

    cell, study = job.cell(), job.study.name  # resources resolved here, where the job starts
    rung = job.params.until  # an adaptive study's rung job (`--until`): the run pauses there
    out = until.already_ended(job.results_dir, study, cell) if rung is not None else None  # finished: a mark only
    if out is None and solo_host(job.results_dir, study, cell, rung).kind == "alone":  # the plan's rule: a pack of one
        from lorarl.pack.run import train_alone

        out = train_alone(study, cell, job.results_dir, threads=job.threads, stop_at=rung)
    elif out is None:
        config = resolve_job(cell.config, results_dir=str(job.results_dir))  # the trainer gets a resolved config
        out = train_cell(study, cell, job.results_dir, threads=job.threads, config=config, stop_at=rung,
                         invocation=job.params.invocation)
    if rung is None or not ranks.is_main():
        return out
    return until.write_mark(job.results_dir, study, cell, rung, **until.mark_fields(out))  # the rung job's output, last


@register_stage("evaluate", "held-out evaluation of one cell or base pseudo-cell (`--eval-target`)",
                outputs=_evaluate_outputs, key_param="eval_target", oom_retry="eval", resources_key="evaluate",
                rule="evaluate", step_rule="evaluate_step", timing=Timing(cost="evaluation"))
def _evaluate(job: Job) -> dict:
    from lorarl.evaluate.main import evaluate_cell

    cell = job.cell()
    targets = [t for t in job.params.eval_target.split(",") if t.strip()] or None  # none: all of the cell's
    return evaluate_cell(job.study.name, cell, job.results_dir, is_base=job.table.is_base(cell.id),
                         threads=job.threads, targets=targets)


@register_stage("diagnose", "weight-space diagnostics of one trained cell", outputs=_diagnose_outputs,
                resources_key="diagnose", rule="diagnose", work="diagnostics", timing=Timing(cost="diagnostics"))
def _diagnose(job: Job) -> dict:
    from lorarl.diagnose.main import diagnose_cell

    return diagnose_cell(job.study.name, job.cell(), job.results_dir, threads=job.threads)


@register_stage("toy", "every cell of a toy KL-bound study in one job (target: all, or a comma list)",
                resources_key="toy", log_cell=".toy")
def _toy(job: Job) -> dict:
    from lorarl.toy.cells import run_toy_study

    ids = None if job.target == "all" else job.target.split(",")
    return {"cells": len(run_toy_study(job.study, job.results_dir, ids))}


@register_stage("pack", "the member cells of one pack trained in one job (target: a comma list)", outputs=_pack_outputs,
                oom_retry="train", resources_key="train", trains=True, members=True, rule="train_pack",
                timing=Timing(cost="training", mean_timed=False))
def _pack(job: Job) -> dict:
    from lorarl.pack import resident
    from lorarl.pack.run import train_pack

    from lorarl.pack.ranks import world
    from lorarl.train import until

    ids, study = job.target.split(","), job.study.name
    pid = job.params.require_pack_id()  # the hosting plan's id (its rung and kind in it), passed by pack.smk
    rung = job.params.until  # a rung's pack (`--until`): every member pauses there
    cells = [job.table.cell(c) for c in ids]
    places = job.params.places  # a resident job (`--places`): its places, else a fixed pack
    chunk = job.params.update_cells  # pack.update_cells (`--update-cells`, a memory knob): None, all at once
    if places:
        out = resident.train_resident(study, cells, job.results_dir, places, threads=job.threads,
                                      resident_id=pid, stop_at=rung, update_cells=chunk)
    else:
        out = train_pack(study, cells, job.results_dir, threads=job.threads, pack_id=pid, stop_at=rung,
                         update_cells=chunk)
    if rung is not None and world()[0] == 0:  # rank 0 holds every rank's outcome: each member's mark, staged
        for c in cells:
            if c.id in out["outcomes"]:  # trained (or paused) here; a member left out: its own rung job trains it
                until.write_mark(job.results_dir, study, c, rung, staged=True, **until.mark_fields(out["outcomes"][c.id]))
        from lorarl import paths
        from lorarl.io import write_json

        # the rule's output (the job's record), written again once every staged mark is there
        write_json(paths.path("pack_done", results=str(job.results_dir), study=study, pack=pid), out)
    return out

