"""Every job a study's Snakemake run will still execute, and how long they take with the profile's parallelism.

Used by `lorarl doctor`'s projection (before the study runs: every job) and `lorarl status --watch`'s ETA (while
it runs: the jobs still to run). :func:`planned_jobs` mirrors workflow/rules/*.smk: a missing ``local:`` base
model (and the recipe it continues from) is a ``base_model`` job; who trains each unfinished cell, and to which
step, is the hosting plan's (lorarl.pack.hosting.hosting_plan, as workflow/rules/pack.smk reads it; an adaptive
study's searched cells: the segments the decisions allow now, a ``train_rung`` job each, their final evaluations
left out); an unfinished cell is a ``train`` job, or with
``pack: {max_cells: K}`` a ``train_pack`` job per pack of two or more compatible cells plus each member's own
``train`` job that only moves the pack's outputs into place (``publish``: a launcher, no job process); with
``pack: {resident: true, places: P}`` one ``train_pack`` job per compatible group of two or more (the pack key
without ``train.steps``: lorarl.pack.resident), its members the whole group, the same way; every evaluation
target (each benchmark, each snapshot step) of a cell and of each ``base`` pseudo-cell is an ``evaluate`` job; a
trained cell gets a ``diagnose`` job; the study ends with one ``aggregate``. A job whose output exists is not run
again (a retrained cell's evaluations and diagnostics are).

:func:`makespan` schedules the jobs as Snakemake does: a job starts when the jobs it waits for are done and the
profile's slots are free (``cores`` of a local profile, each job taking its rule's ``threads``; ``jobs`` on
Slurm). On a shared machine (a local profile) the running jobs also share the CPUs the machine gives their session
beside other users' work (processor sharing, :func:`machine_rate`): a job is ``cpu`` seconds of work on an idle
core plus ``wait`` seconds that do not depend on the CPU (sleeps, I/O, a GPU).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lorarl.pack.hosting import MEMBER_PRIORITY, PACK_PRIORITY
from lorarl.pipeline.jobs.stages import STAGES, Stage, Timing, get_stage

# A planned job's kind is the stage it runs (lorarl.pipeline.jobs.stages: its rule, the rule's threads, its record,
# its timing), but for the two kinds that run none of their own, whose facts the doctor holds here: a pack member's
# publish job is the train rule's job that moves the pack's outputs into place (a launcher, no job process: it costs
# the launcher's start), and the study's aggregate rule runs `lorarl aggregate` (the doctor times a fresh one; it runs
# on what finished when a job it waits for failed).
@dataclass(frozen=True)
class OwnKind:
    stage: str  # the stage whose rule runs it ("": none; its rule is the kind's name, 1 thread)
    timing: Timing  # how the doctor's projection and the watch's ETA time it (lorarl.pipeline.jobs.stages.Timing)


AGGREGATE = "aggregate"  # the kind (and rule: workflow/rules/aggregate.smk, 1 thread) of the study's last job
OWN_KINDS = {"publish": OwnKind("train", Timing(cost="launcher", mean_timed=False, of_cell=True)),
             AGGREGATE: OwnKind("", Timing(cost="aggregate", keeps_going=True))}


def job_kinds() -> set[str]:
    """Every kind of job a study's run executes (a registered stage with a rule, publish, aggregate)."""
    return {n for n, s in STAGES.items() if s.rule} | set(OWN_KINDS)


# Snakemake's `priority:` of each kind's job (workflow/rules/*.smk, from lorarl.pack.hosting; any other kind 0): a
# pack before its members' train jobs ("publish": a packed member's), those before evaluations and diagnoses
START_PRIORITY = {"pack": PACK_PRIORITY, "publish": MEMBER_PRIORITY}


@dataclass(frozen=True)
class PlannedJob:
    kind: str  # base | train | pack | publish | evaluate | diagnose | aggregate
    cell: str  # the cell (a recipe for base, a pack id for pack, the study for aggregate)
    target: str = ""  # evaluate: benchmark[@step]; pack: its members, comma-separated; train/publish: until=<rung>
    after: tuple[str, ...] = ()  # keys of the jobs it waits for before it starts
    base: bool = False  # evaluate: of a base pseudo-cell
    holds: str = ""  # publish: its pack's key; it starts when a slot is free and holds it until the pack ends

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.cell}:{self.target}"

    @property
    def stage(self) -> Stage | None:
        """The registry's entry of the stage it runs (None: the aggregation, which runs no stage)."""
        own = OWN_KINDS.get(self.kind)
        name = own.stage if own else self.kind
        return get_stage(name) if name else None

    @property
    def timing(self) -> Timing:
        """How the doctor's projection and the watch's ETA time it: its stage's, or its own kind's."""
        own = OWN_KINDS.get(self.kind)
        return own.timing if own else get_stage(self.kind).timing

    @property
    def threads(self) -> int:
        return self.stage.rule_threads if self.stage else 1

    @property
    def rule(self) -> str:
        s = self.stage
        if s is None:
            return self.kind  # the aggregation: its own rule
        if s.rung_rule and self.target.startswith("until="):
            return s.rung_rule  # a segment of a search up to a rung (lorarl.pack.hosting)
        return s.step_rule if s.step_rule and "@" in self.target else s.rule


def rule_counts(jobs: list[PlannedJob]) -> dict[str, int]:
    """Jobs per Snakemake rule (what its job-stats table counts)."""
    out: dict[str, int] = {}
    for j in jobs:
        out[j.rule] = out.get(j.rule, 0) + 1
    return out


def parse_job_stats(log: str) -> dict[str, int]:
    """Jobs per rule from Snakemake's "Job stats" table (its log or a dry run's), without the ``all`` rule."""
    out: dict[str, int] = {}
    on = False
    for line in log.splitlines():
        parts = line.split()
        if line.startswith("job ") and "count" in line:
            on = True
        elif on and len(parts) == 2 and parts[1].isdigit() and parts[0] not in ("total", "all"):
            out[parts[0]] = int(parts[1])
        elif on and parts and parts[0] == "total":
            break
    return out


def planned_jobs(study: Any, results_dir: str | Path, pack_max_cells: int = 1, places: int = 0,
                 search_on: bool = True) -> list[PlannedJob]:
    """The jobs `snakemake all` would run for this study now, in the order the rules are listed. ``pack_max_cells``,
    ``places``: the profile's ``pack`` setting (lorarl.pack.plan.max_cells, resident_places; places 0: fixed packs);
    ``search_on``: False as under ``--config search=off``. The training jobs are the hosting plan's
    (lorarl.pack.hosting.hosting_plan), as workflow/rules/pack.smk reads it."""
    from lorarl import paths
    from lorarl.language.evalplan.plan import eval_targets, format_target
    from lorarl.language.kinds import get_kind
    from lorarl.models import cell_models, parent_recipe, recipe_name
    from lorarl.pack.hosting import Runtime, hosting_plan
    from lorarl.pack.publish import unfinished
    from lorarl.language.study import base_cells, study_cells

    if "train" not in get_kind(study.kind).cell_stages:
        return []
    res, name = str(results_dir), study.name
    jobs: dict[str, PlannedJob] = {}

    def add(job: PlannedJob) -> str:
        jobs.setdefault(job.key, job)
        return job.key

    def base_job(recipe: str) -> list[str]:
        """The key of the missing base model's job (after its parent's), or nothing when it is built."""
        if Path(paths.path("base_model", results=res, name=recipe)).exists():
            return []
        parent = parent_recipe(recipe)
        return [add(PlannedJob("base", recipe, after=tuple(base_job(parent) if parent else ())))]

    def models(cfg: Any) -> tuple[str, ...]:
        names = [recipe_name(m) for m in cell_models(cfg)]
        return tuple(k for n in dict.fromkeys(names) if n for k in base_job(n))

    cells = study_cells(study)
    plan = hosting_plan(study, Runtime(pack_max_cells, places, search_on), res)  # who trains what: pack.smk's plan
    trained: dict[str, str] = {}
    by = {c.id: c for c in cells}
    for cid, host in plan.items():  # study order; a pack where its first member is, its members right after it
        if cid in trained:
            continue
        rung = "" if host.until is None else f"until={host.until}"  # a segment: the member's train_rung job
        if host.packed:
            pack = add(PlannedJob("pack", host.job, ",".join(host.members), models(by[host.members[0]].config)))
            for m in host.members:  # the member's own train (or train_rung) launcher waits for its pack
                trained[m] = add(PlannedJob("publish", m, rung, models(by[m].config), holds=pack))
        else:
            trained[cid] = add(PlannedJob("train", cid, rung, models(by[cid].config)))
    evals = []
    for c in cells:
        kw = dict(results=res, study=name, cell=c.id)
        host = plan.get(c.id)
        if (host is not None and host.segment) or (host is None and unfinished(res, name, c.id, c.hash)):
            continue  # a search's cell: its evaluations wait on the search's decisions (beyond this plan)
        after = (trained[c.id],) if c.id in trained else ()
        for bench, step in eval_targets(c.config, False):
            out = paths.path("eval_summary" if step is None else "eval_step_summary", benchmark=bench, step=step, **kw)
            if after or not Path(out).exists():
                evals.append(PlannedJob("evaluate", c.id, format_target(bench, step), after))
        if after or not Path(paths.path("diagnostics", **kw)).exists():
            evals.append(PlannedJob("diagnose", c.id, after=after))
    for b in base_cells(study):
        after = models(b.config)
        for bench, step in eval_targets(b.config, True):
            out = paths.path("eval_summary", benchmark=bench, results=res, study=name, cell=b.id)
            if after or not Path(out).exists():
                evals.append(PlannedJob("evaluate", b.id, format_target(bench, step), after, base=True))
    for j in evals:
        add(j)
    if jobs or not Path(paths.path("table_md", results=res, study=name)).exists():
        add(PlannedJob("aggregate", name, after=tuple(jobs)))
    return list(jobs.values())


def machine_rate(load: dict | None) -> Callable[[int], float]:
    """Per-thread CPU rate of ``k`` runnable threads of ours on a shared machine, from the doctor's load sample
    (lorarl.pipeline.doctor.clock.LoadSampler: ``capacity[k]`` = CPUs our session gets with k runnable threads);
    1 without a sample (each job alone on its allocation)."""
    cap = {int(k): float(v) for k, v in ((load or {}).get("capacity") or {}).items()}

    def rate(k: int) -> float:
        k = max(int(k), 1)
        if not cap:
            return 1.0
        return max(min(1.0, cap.get(k, cap[max(cap)]) / k), 1e-6)

    return rate


def makespan(jobs: list[PlannedJob], cost: Callable[[PlannedJob], tuple[float, float]], slots: int,
             rate: Callable[[int], float] | None = None, started: dict[str, float] | None = None,
             count_threads: bool = True) -> float:
    """Seconds until the last job ends. ``cost(job)`` = (cpu, wait) seconds; ``slots``: the threads (local) or
    jobs (Slurm, ``count_threads`` False: one slot a job) that may run at once; ``rate(k)``: the CPU share of each
    of k running threads on a shared machine (:func:`machine_rate`; None: each job alone, rate 1); ``started``:
    keys of jobs already running -> the share of their cost already done (they go first). Ready jobs start in
    list order, by their rules' priority as Snakemake starts them (:data:`START_PRIORITY`: packs, then packed members'
    train jobs, then the rest); a job needing more threads than there are slots runs alone (Snakemake scales its
    threads down)."""
    order = sorted(range(len(jobs)), key=lambda i: -START_PRIORITY.get(jobs[i].kind, 0))  # stable: else list order
    rank = {i: r for r, i in enumerate(order)}
    index = {j.key: i for i, j in enumerate(jobs)}
    width = [min(j.threads, slots) if count_threads else 1 for j in jobs]
    waits = [sum(a in index for a in set(j.after)) for j in jobs]  # jobs it still waits for
    needed_by: dict[int, list[int]] = {}
    for i, j in enumerate(jobs):
        for a in set(j.after):
            if a in index:
                needed_by.setdefault(index[a], []).append(i)
    held = [index.get(j.holds) if j.holds else None for j in jobs]
    done = [False] * len(jobs)
    ready = [(rank[i], i) for i in range(len(jobs)) if not waits[i]]
    heapq.heapify(ready)
    running: dict[int, float] = {index[k]: min(max(f, 0.0), 0.999) for k, f in (started or {}).items() if k in index}
    t, left = 0.0, len(jobs)
    while left:
        used = sum(width[i] for i in running)
        skipped = []
        while ready:
            r, i = heapq.heappop(ready)
            if i in running or done[i]:
                continue
            if used + width[i] <= slots or not running:
                running[i] = 0.0
                used += width[i]
            else:
                skipped.append((r, i))
        for x in skipped:
            heapq.heappush(ready, x)
        if not running:
            raise ValueError("a job waits for a job that never runs: " +
                             ", ".join(sorted(jobs[i].key for i in range(len(jobs)) if not done[i])))
        busy = [i for i in running if held[i] is None or done[held[i]]]
        if not busy:
            raise ValueError("every running job waits for a pack that cannot start: " +
                             ", ".join(sorted(jobs[i].key for i in running)))
        r = rate(sum(width[i] for i in busy)) if rate else 1.0
        total = {}
        for i in busy:
            cpu, wait = cost(jobs[i])
            total[i] = max(cpu / r + wait, 1e-9)
        dt = min((1.0 - running[i]) * total[i] for i in busy)
        t += dt
        for i in busy:
            running[i] += dt / total[i]
            if running[i] >= 1.0 - 1e-9:
                del running[i]
                done[i] = True
                left -= 1
                for n in needed_by.get(i, []):
                    waits[n] -= 1
                    if not waits[n]:
                        heapq.heappush(ready, (rank[n], n))
    return t


def as_rows(jobs: list[PlannedJob], cost: dict[str, tuple[float, float]]) -> list[dict[str, Any]]:
    """The planned jobs with their (cpu, wait) seconds, as JSON rows (the projection's ``schedule``)."""
    return [{"kind": j.kind, "cell": j.cell, "target": j.target, "after": list(j.after), "holds": j.holds,
             "base": j.base, "cpu_s": cost[j.key][0], "wait_s": cost[j.key][1]} for j in jobs]


def from_rows(rows: list[dict[str, Any]]) -> tuple[list[PlannedJob], dict[str, tuple[float, float]]]:
    jobs = [PlannedJob(r["kind"], r["cell"], r["target"], tuple(r["after"]), r.get("base", False), r.get("holds", ""))
            for r in rows]
    return jobs, {j.key: (r["cpu_s"], r["wait_s"]) for j, r in zip(jobs, rows)}


def wall_under(projection: dict[str, Any], load: dict | None) -> float:
    """Seconds the projection's jobs take on its profile's slots with another load sample (e.g. one taken while the
    study ran: the machine's conditions then, the jobs' costs as the doctor measured them)."""
    jobs, cost = from_rows(projection["schedule"])
    shared = projection.get("shared_machine", True)
    rate = machine_rate(load) if shared else None
    cpu, wait = projection.get("scheduler") or (0.0, 0.0)  # Snakemake's own start, before any job
    return cpu / (rate(1) if rate else 1.0) + wait + makespan(jobs, lambda j: cost[j.key],
                                                              projection["concurrent_jobs"], rate, count_threads=shared)
