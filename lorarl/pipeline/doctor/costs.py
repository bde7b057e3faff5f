"""What one job of each kind costs, from `lorarl doctor`'s measurements (lorarl.pipeline.doctor.projection).

Every job of a study starts from nothing: Snakemake starts `lorarl launch` (a fresh interpreter, the launcher's
imports, the study's cell table: the doctor times this in a fresh process, ``login.launcher``), which submits the
job (provenance, ``pip freeze``, the executor: from the doctor's own submission to its job process's start) and
waits for it; the job process starts (interpreter, submitit, the launcher's modules: the doctor job's age at its
entry, ``clock.proc_s``), reads the study again, imports its libraries (``phases.stack``: torch, transformers,
peft, MLflow, timed first thing in the doctor job), opens the MLflow store (``phases.mlflow_open``: a sqlite
store's schema check; the first job of the study also creates it: ``phases.mlflow``, charged once), loads the
model (the first load, less a warm one, is the rest of the libraries' first use) and only then works; when it ends, the launcher sees it and
exits (from the doctor job's end to the doctor's submission returning: ``teardown``). The work itself is the
doctor's smoke, scaled: training by the cell's optimiser updates (lorarl.pipeline.doctor.projection.step_seconds;
what the smoke training spent beside its steps is the job's fixed part), an evaluation by the benchmark's problems
(the doctor evaluates one problem first, so its timed evaluation is warm: seconds per problem, and what the first
problem cost beyond them is the job's fixed part), diagnostics as measured, aggregation as a fresh
`lorarl aggregate` of the smoke study (``login.aggregate``), a base model as the doctor's own build of it. A job
also waits on a lock, a claim or a decision (the cost ledger's ``wait`` phase, lorarl.ledger): each job of a kind is
charged the mean wait the study's own recorded jobs of that stage spent (:func:`recorded_waits`; an earlier or
interrupted run of the study, e.g. on the same machine and store), as seconds that do not depend on the CPU; with
no records, none.

Each part is (wall seconds, CPU seconds) as measured while the doctor job ran alone in its session on a machine that
may be shared (the doctor job's load sample gives its CPU share); a job's cost is (cpu, wait): CPU seconds on an idle
core and seconds that do not depend on the CPU (lorarl.pipeline.doctor.jobs.makespan). A part whose CPU time was not
measured counts as CPU-bound.
"""

from __future__ import annotations

from typing import Any, Callable

from lorarl.pipeline.doctor.jobs import PlannedJob, machine_rate

Part = tuple[float, float]  # (wall seconds, CPU seconds) as measured


class JobCosts:
    """(cpu, wait) seconds of a planned job, and the parts it is made of."""

    def __init__(self, m: dict, shared: bool, waits: dict[str, tuple[float, int]] | None = None):
        self.sample = (m.get("load") or {}) if shared else {}
        self.machine = machine_rate(self.sample) if shared else None  # per-thread CPU rate of k running threads
        self.rate = self.machine(1) if self.machine else 1.0  # a lone job's share of a core when measured
        self.m, self.ph = m, m.get("phases") or {}
        self.waits = waits or {}  # stage -> (mean wait seconds per recorded job, jobs recorded): recorded_waits
        login, clock = m.get("login") or {}, m.get("clock") or {}
        self.notes: list[str] = []
        probe = login.get("launcher") or {}
        self.launcher = self._part(probe.get("wall_s", 0.0), probe.get("cpu_s"))
        study = probe.get("study_s", 0.0)
        submit = self._gap(login.get("submitted_epoch"), clock.get("process_start_epoch"))
        teardown = self._gap(clock.get("end_epoch"), login.get("returned_epoch"))
        self.overhead = _sum(self.launcher, self._part(submit), self._part(clock.get("proc_s") or 0.0),
                             self._part(study), self._part(teardown))  # a launched job, before and after its work
        first = self._phase("first_load")
        self.load = self._phase("model_load") if "model_load" in self.ph else self._part(m.get("model_load_s", 0.0))
        opened = "mlflow_open" in self.ph  # else (older measurements) every job is charged the store's creation
        self.stack = _sum(self._phase("stack"), self._phase("mlflow_open" if opened else "mlflow"),
                          _minus(first, self.load))
        self.store_once = self._phase("mlflow") if opened else (0.0, 0.0)  # the study's store, created once
        dry = login.get("snakemake") or {}  # Snakemake's own start: reading the workflow and the study, the DAG
        self.scheduler = self._part(dry.get("wall_s", 0.0), dry.get("cpu_s"))
        self.train_checks = _sum(self._phase("rollout"), self._phase("regime"), self._phase("train_data"))
        self.parts = {"launcher": self.launcher, "submit": self._part(submit), "job process": self._part(
            clock.get("proc_s") or 0.0), "study table": self._part(study), "teardown": self._part(teardown),
            "imports + MLflow store + first load": self.stack, "model load": self.load,
            "MLflow store creation (once)": self.store_once, "Snakemake's start (once)": self.scheduler}
        agg = login.get("aggregate") or {}
        self.aggregate = self._part(agg.get("wall_s", 0.0), agg.get("cpu_s"))
        base = login.get("base") or {}
        self.base = _sum(self.launcher, self._part(base.get("wall_s", 0.0))) if base else None

    # ------------------------------------------------------------------ parts
    def _part(self, wall: float, cpu: float | None = None) -> Part:
        wall = max(float(wall or 0.0), 0.0)
        return wall, (wall * self.rate if cpu is None else max(float(cpu), 0.0))

    def _phase(self, name: str) -> Part:
        p = self.ph.get(name)
        return self._part(p["wall_s"], p.get("cpu_s")) if p else (0.0, 0.0)

    @staticmethod
    def _gap(a: float | None, b: float | None) -> float:
        return max(b - a, 0.0) if a is not None and b is not None else 0.0

    def split(self, part: Part) -> tuple[float, float]:
        """(cpu on an idle core, wait) of a (wall, cpu) part measured at ``self.rate``."""
        wall, cpu = part
        cpu = min(cpu, wall * self.rate)
        return cpu, max(wall - cpu / self.rate, 0.0)

    # ------------------------------------------------------------------ jobs
    def train_fixed(self, smoke_work_s: float) -> Part:
        """What the smoke training cost beside its steps (model load, trainer, the libraries' first use, saving)."""
        if "train" not in self.ph:
            return self.load
        wall, cpu = self._phase("train")
        fixed = max(wall - smoke_work_s, 0.0)
        return fixed, cpu * fixed / wall if wall else 0.0

    def work(self, seconds: float, phase: str) -> Part:
        """``seconds`` of a phase's kind of work, at that phase's measured CPU share."""
        wall, cpu = self._phase(phase)
        share = cpu / wall if wall else self.rate
        return seconds, seconds * share

    def eval_fixed(self, name: str) -> Part:
        """An evaluation job's model load plus what its first problem cost beyond the warm per-problem time."""
        e, first = (self.m.get("evaluation") or {}).get(name) or {}, self._phase("eval_first")
        if not e or first == (0.0, 0.0):
            return self.load
        per = e["seconds_per_problem"]
        rest = max(first[0] - self.load[0] - per, 0.0)
        return _sum(self.load, (rest, first[1] * rest / first[0] if first[0] else 0.0))

    def wait(self, kind: str) -> Part:
        """A job of this kind's mean recorded wait on a lock, a claim or a decision: wall seconds, no CPU."""
        return self.waits.get(kind, (0.0, 0))[0], 0.0

    def launched(self, *parts: Part, model: bool = True) -> Part:
        return _sum(self.overhead, *((self.stack,) if model else ()), *parts)


def _sum(*parts: Part) -> Part:
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _minus(a: Part, b: Part) -> Part:
    return max(a[0] - b[0], 0.0), max(a[1] - b[1], 0.0)


def recorded_waits(records: list[dict]) -> dict[str, tuple[float, int]]:
    """Per stage: (mean ``wait`` phase seconds per job, jobs recorded) of cost-ledger records (lorarl.ledger)."""
    sums: dict[str, list[float]] = {}
    for r in records:
        sums.setdefault(str(r.get("stage")), []).append(float((r.get("phases_s") or {}).get("wait") or 0.0))
    return {k: (sum(v) / len(v), len(v)) for k, v in sums.items()}


def job_part(c: JobCosts, job: PlannedJob, train: dict[str, Part], evals: dict[tuple[str, str], Part | None],
             diag: Part) -> Part | None:
    """(wall, cpu) of a planned job as measured conditions would have it, with its kind's recorded waits; None: not
    measured."""
    part = _work_part(c, job, train, evals, diag)
    return None if part is None else _sum(part, c.wait(job.kind))


def _work_part(c: JobCosts, job: PlannedJob, train: dict[str, Part], evals: dict[tuple[str, str], Part | None],
               diag: Part) -> Part | None:
    """The measured part its kind's ``Timing.cost`` names (lorarl.pipeline.jobs.stages.Timing): the projection's
    training of its cell (a pack's: of its members, by the job), its evaluation target's, the diagnostics', the
    launcher's start, a fresh aggregation, the doctor's build of a base model."""
    cost = job.timing.cost
    if cost not in WORK:
        raise ValueError(f"job kind {job.kind!r}: unknown cost {cost!r}; allowed: {', '.join(WORK)}")
    return WORK[cost](c, job, train, evals, diag)


WORK: dict[str, Callable[..., Part | None]] = {  # Timing.cost -> (costs, job, train, evals, diag) -> its part
    "training": lambda c, job, train, evals, diag: train[job.key if job.stage.members else job.cell],
    "launcher": lambda c, job, train, evals, diag: c.launcher,
    "evaluation": lambda c, job, train, evals, diag: evals.get((job.cell, job.target)),
    "diagnostics": lambda c, job, train, evals, diag: diag,
    "aggregate": lambda c, job, train, evals, diag: c.aggregate,
    "build": lambda c, job, train, evals, diag: c.base,
}


def describe(c: JobCosts) -> dict[str, Any]:
    """The per-job start-up parts in seconds (as measured), for the report."""
    return {k: round(v[0], 3) for k, v in c.parts.items()} | {
        f"wait ({kind}, mean of {n} recorded)": round(w, 3) for kind, (w, n) in sorted(c.waits.items())} | {
        "per launched job": round(c.overhead[0], 3), "per model job (+ imports, store, first load)":
        round(c.overhead[0] + c.stack[0], 3), "cpu share of a lone job": round(c.rate, 3)}
