"""The doctor's projection of a whole study from one smoke cell's measurements (`lorarl doctor`).

Cost model of one optimiser step of a cell ``c``, from the smoke cell's split (``s``):

* a step scores ``R_c`` generation rounds (``R = 1`` without DAPO dynamic sampling; with it, the expected
  rounds until the batch holds ``P`` groups with signal, :func:`expected_rounds`); one round costs
  generation x ``P G L`` (completion budget, decode-bound) + the rest of scoring (reward, old-policy
  forward) x ``P G (prompt + L)`` (every forward reads prompt and completion), each relative to ``s``;
* after the rounds: reference forward + policy forward/backward + optimiser x ``P G (prompt + L)``.

``prompt`` is the mean token length of the cell's training prompts as its own tokenizer and prompt
settings make them (measured in the job by :func:`prompt_tokens_by_cell`). Every assumption is written
into the report.

Layout (:func:`stage_layouts`): a stage's job has the profile's ``slurm.<stage>`` ``nodes`` x
``gpus_per_node`` GPUs. A cell trains on ``W_c`` ranks (lorarl.memory.ranks.Layout.ranks); the smoke on
``W_0`` (its job's ``WORLD_SIZE``): every part of a step (generation, scoring, reference forward, policy
forward/backward + optimiser) works on a rank's share of the batch and is scaled by ``W_0 / W_c``, ideal
data-parallel scaling (gradient all-reduce, FSDP2 gathers and stragglers not charged); model loads, KL
monitors, evaluations and diagnostics are not. GPU-hours = job seconds x the job's GPUs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

PROMPT_SAMPLE = 256  # training prompts tokenised per (model, task, prompt settings) to measure their length


# ----------------------------------------------------------------------------- in the job
def prompt_key(cfg: Any) -> str:
    """What decides a cell's training prompts in tokens: model (tokenizer), task, prompt settings, length cap."""
    import json

    return json.dumps([cfg.model, cfg.task.model_dump(mode="json"), cfg.prompt.model_dump(mode="json"),
                       cfg.train.max_prompt_length], sort_keys=True)


def prompt_tokens(cfg: Any, results_dir: str) -> float:
    """Mean token length of the first PROMPT_SAMPLE training prompts of a cell, as TRL tokenises them."""
    from transformers import AutoTokenizer

    from lorarl.models import resolve_model
    from lorarl.tasks import task_records
    from lorarl.tasks.prompt import prompt_ids, training_prompts, within_length

    tok = AutoTokenizer.from_pretrained(str(resolve_model(cfg.model, results_dir)))
    rows = task_records(cfg.task)[0][:PROMPT_SAMPLE]
    prompts = training_prompts(cfg, [r["prompt"] for r in rows], tok)
    lengths = [len(prompt_ids(tok, p, cfg.prompt)) for p, keep in zip(prompts, within_length(cfg, prompts, tok)) if keep]
    if not lengths:
        raise ValueError("every sampled training prompt is longer than train.max_prompt_length")
    return sum(lengths) / len(lengths)


def prompt_tokens_by_cell(study_path: str, results_dir: str) -> tuple[dict[str, float], list[str]]:
    """Mean training-prompt tokens of every cell of the study (one measurement per distinct prompt key)."""
    from lorarl.language.study import load_study, study_cells

    by_key: dict[str, float | None] = {}
    notes: list[str] = []
    out: dict[str, float] = {}
    for c in study_cells(load_study(study_path)):
        key = prompt_key(c.config)
        if key not in by_key:
            try:
                by_key[key] = prompt_tokens(c.config, results_dir)
            except Exception as err:  # noqa: BLE001 - reported; the projection falls back to the smoke cell's
                by_key[key] = None
                notes.append(f"{c.id}: prompt length not measured ({type(err).__name__}: {str(err)[:200]})")
        if by_key[key] is not None:
            out[c.id] = by_key[key]
    return out, notes


# ----------------------------------------------------------------------------- arithmetic
def _binom_cdf(k: int, n: int, q: float) -> float:
    """P(Binomial(n, q) <= k), summed in log space (n up to a few thousand)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    lq, l1q = math.log(q), math.log1p(-q)
    total = 0.0
    for i in range(k + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lq + (n - i) * l1q)
    return min(total, 1.0)


def expected_rounds(p: float, groups: int, max_rounds: int) -> float:
    """Expected generation rounds of one DAPO step: each round samples ``groups`` prompt groups, each
    degenerate (all rewards equal) with probability ``p`` independently; rounds go on while fewer than
    ``groups`` groups with signal are kept, at most ``max_rounds`` (lorarl.train.dynamic_sampling).
    E[R] = sum_{r=0}^{M-1} P(R > r) = 1 + sum_{r=1}^{M-1} P(Binomial(r*groups, 1-p) < groups)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"degenerate-group rate {p} is not a probability")
    if p == 0.0:
        return 1.0
    if p == 1.0:
        return float(max_rounds)
    return 1.0 + sum(_binom_cdf(groups - 1, r * groups, 1.0 - p) for r in range(1, max_rounds))


def _tokens(cfg: Any, prompt: float) -> tuple[float, float]:
    """(completion-token budget, prompt + completion tokens) of one step's P x G sequences."""
    t = cfg.train
    seqs = t.prompts_per_step * t.generations
    return float(seqs * t.max_completion_length), float(seqs * (prompt + t.max_completion_length))


def generate_every(t: Any) -> int:
    """Optimiser steps per rollout batch: PPO mini-batches x passes (TRL: steps_per_generation x num_iterations)."""
    return t.updates_per_generation * t.num_iterations


def step_seconds(cfg: Any, split: dict[str, float], smoke_cfg: Any, prompt: float, smoke_prompt: float,
                 rate: float | None) -> tuple[float, float]:
    """(projected seconds per optimiser step, expected generation rounds per rollout) of one cell.

    From the smoke ``0``: one round's generation ``g0`` and other scoring ``o0``, the reference forward of a
    rollout batch ``f0`` and the policy forward/backward + optimiser of a step ``b0`` (on ``1/u0`` of the
    batch with ``u0`` PPO mini-batches). A cell ``c`` with rollouts every ``k_c`` steps and ``R_c`` rounds:
    ``R_c/k_c (g0 gen_c/gen0 + o0 seq_c/seq0) + f0 seq_c/seq0 / k_c + b0 (seq_c/u_c) / (seq0/u0)``."""
    t, t0 = cfg.train, smoke_cfg.train
    gen0, seq0 = _tokens(smoke_cfg, smoke_prompt)
    gen_c, seq_c = _tokens(cfg, prompt)
    rounds0 = split.get("generation_rounds_per_step") or 1.0 / generate_every(t0)
    score = split.get("scoring_s", split["rollout_generation_s"] + split["reward_s"] +
                      split["old_policy_forward_and_advantages_s"])
    g0 = split["rollout_generation_s"] / rounds0
    o0 = max(score - split["rollout_generation_s"], 0.0) / rounds0
    b0 = split["policy_forward_backward_s"]
    if t.beta <= 0:  # no reference forward (the trainer runs it only when beta > 0)
        f0 = 0.0
    elif t0.beta > 0:
        f0 = split["reference_forward_s"] * generate_every(t0)
    else:  # not measured: one forward of the rollout batch = a third of its forward + backward (1:2 FLOPs)
        f0 = b0 * t0.updates_per_generation / 3
    if t.dynamic_sampling:
        rounds = expected_rounds(rate, t.prompts_per_step, t.dynamic_sampling_max_batches) if rate is not None \
            else float(t.dynamic_sampling_max_batches)
    else:
        rounds = 1.0
    k_c = generate_every(t)
    per_round = g0 * gen_c / gen0 + o0 * seq_c / seq0
    step = rounds / k_c * per_round + f0 * seq_c / seq0 / k_c + \
        b0 * (seq_c / t.updates_per_generation) / (seq0 / t0.updates_per_generation)
    return step, rounds


def stage_layouts(profile: dict, device_kind: str) -> dict[str, Any]:
    """The :class:`~lorarl.memory.ranks.Layout` of each stage's jobs from the profile's slurm resources (no
    GPUs asked on a CPU smoke: None)."""
    from lorarl.memory.ranks import Layout

    slurm = profile.get("slurm") or {}
    out = {}
    for stage in ("train", "evaluate", "diagnose"):
        res = slurm.get(stage) or {}
        gpus = int(res.get("gpus_per_node", 1 if device_kind == "cuda" else 0))
        out[stage] = Layout(gpus, int(res.get("nodes") or 1)) if gpus > 0 else None
    return out


def _train_ranks_and_gpus(profile: dict, study: str, cfg: Any, on_gpus: bool) -> tuple[int, int]:
    """A cell's training ranks and GPUs by the launcher's own rule (lorarl.pipeline.jobs.train_layout: the per-model
    and per-study overrides, ``tasks_per_node``, the teacher's GPU); no GPUs on a CPU smoke."""
    from lorarl.pipeline.jobs import train_layout

    res = train_layout.train_resources((profile.get("slurm") or {}).get("train"), study, cfg.model)
    gpus = int(res.get("nodes") or 1) * int(res.get("gpus_per_node", 1 if on_gpus else 0) or 0)
    if gpus < 1:  # a CPU job: its tasks are its ranks
        return (train_layout.ranks(res, cfg) if "tasks_per_node" in res else 1), 0
    return train_layout.ranks(res, cfg), gpus


def _gpus(layout: Any) -> int:
    return layout.gpus if layout is not None else 0


def _problem_counts(cfg: Any, measured: dict) -> tuple[dict[str, int], list[str]]:
    from lorarl.language.evalplan.plan import benchmark_specs
    from lorarl.evaluate.main import load_problems

    counts, notes = {}, []
    for name in benchmark_specs(cfg):
        try:
            counts[name] = len(load_problems(name, cfg))
        except Exception as err:  # noqa: BLE001 - no network on this node, say so
            counts[name] = measured.get(name, {}).get("problems", 0)
            notes.append(f"{name}: full problem count unavailable here ({type(err).__name__}); used the smoke's {counts[name]}")
    return counts, notes


def _monitors(t: Any, split: dict) -> float:
    return (t.steps // t.kl_monitor_every) * split["kl_monitor_per_run_s"] if t.kl_monitor_every else 0.0


def project(study: Any, chosen: Any, m: dict, profile: dict, results_dir: str | None = None) -> dict[str, Any]:
    """Whole-study time and GPU-hours from the smoke's measurements: every job the study's run will execute
    (lorarl.pipeline.doctor.jobs), each with its start-up and work (lorarl.pipeline.doctor.costs), scheduled
    on the profile's slots; the assumptions spelled out."""
    from lorarl.language.evalplan.plan import parse_target
    from lorarl.pack.plan import max_cells, resident_places
    from lorarl.pipeline.doctor.costs import JobCosts, _sum, describe, job_part, recorded_waits
    from lorarl.pipeline.doctor.jobs import as_rows, job_kinds, makespan, planned_jobs, rule_counts
    from lorarl.pipeline.doctor.packs import pack_steps, places_refused
    from lorarl.report.cost import read_records
    from lorarl.language.study import study_cells

    split, evals = m["split"], m.get("evaluation", {})
    cells = study_cells(study)
    counts, notes = _problem_counts(chosen.config, evals)
    prompts = m.get("prompt_tokens") or {}
    notes += m.get("prompt_tokens_notes") or []
    smoke_prompt = prompts.get(chosen.id)
    if smoke_prompt is None:
        notes.append("the smoke cell's prompt length was not measured: prompt tokens counted as 0")
        smoke_prompt = 0.0
    rate = split.get("degenerate_rate")
    lay = stage_layouts(profile, m["device"]["kind"])
    w0 = int(m.get("train_ranks") or 1)
    shared = profile.get("launcher", "local") != "slurm"  # local/debug: the jobs share the doctor's machine
    results = results_dir or (m.get("request") or {}).get("results") or "/nonexistent/results"
    kinds = job_kinds()
    waits = {k: v for k, v in recorded_waits(read_records(results, study.name)).items() if k in kinds}
    c = JobCosts(m, shared, waits)
    t0 = chosen.config.train
    smoke_step = step_seconds(chosen.config, split, chosen.config, smoke_prompt, smoke_prompt, rate)[0]
    fixed = _sum(c.launched(c.train_checks), c.train_fixed(t0.optimizer_updates * smoke_step + _monitors(t0, split)))
    work, gpus_of, detail = {}, {}, []
    for cell in cells:
        t = cell.config.train
        prompt = prompts.get(cell.id, smoke_prompt)
        step_s, rounds = step_seconds(cell.config, split, chosen.config, prompt, smoke_prompt, rate)
        ranks, gpus_of[cell.id] = _train_ranks_and_gpus(profile, study.name, cell.config, lay["train"] is not None)
        step_s *= w0 / ranks  # each rank works on its share of the batch: ideal data-parallel scaling
        work[cell.id] = c.work(t.optimizer_updates * step_s + _monitors(t, split), "train")  # step_s: per update
        detail.append({"cell": cell.id, "prompt_tokens": round(prompt, 1), "rounds_per_rollout": round(rounds, 3),
                       "step_s": step_s, "steps": t.steps, "ranks": ranks})
    pack, places = max_cells(profile.get("pack")), resident_places(profile.get("pack"))  # refused before: doctor.report
    jobs = planned_jobs(study, results, pack, places)
    train = {cid: _sum(fixed, w) for cid, w in work.items()}
    for j in jobs:  # a pack, fixed or resident: one start-up; the members' steps one after another (no batching gain)
        if j.stage is not None and j.stage.members:
            members = j.target.split(",")
            train[j.key] = _sum(fixed, *(work[x] for x in members))
            gpus_of[j.key] = gpus_of[members[0]]
    eval_parts: dict = {}
    for j in jobs:
        if j.timing.cost == "evaluation":  # its target's benchmark, scaled by its problems
            name = parse_target(j.target)[0]
            e = evals.get(name)
            if e is None:
                notes.append(f"{name}: not measured in the smoke cell; its evaluation jobs are not projected")
            eval_parts[(j.cell, j.target)] = None if e is None else c.launched(c.eval_fixed(name), c.work(
                e["seconds_per_problem"] * counts.get(name, e["problems"]), f"eval:{name}"))
    diag = c.launched(c.work(m.get("diagnose_s", 0.0), "diagnose"))
    parts, unmeasured = {}, set()
    for j in jobs:
        part = job_part(c, j, train, eval_parts, diag)
        if part is None or (j.kind in ("aggregate", "base") and not part[0]):
            unmeasured.add(j.kind)
            part = (0.0, 0.0)
        parts[j.key] = part
    first = next((j for j in jobs if j.kind in ("train", "pack", "evaluate", "diagnose")), None)
    store = Path(results) / "mlflow.db" if str(profile.get("tracking", "sqlite")) == "sqlite" else None
    if first is not None and not (store and store.exists()):  # the study's MLflow store: created by its first job
        parts[first.key] = _sum(parts[first.key], c.store_once)
    gpus = {s: _gpus(v) for s, v in lay.items()}

    def total(*kinds: str) -> float:
        return sum(parts[j.key][0] for j in jobs if j.kind in kinds)

    gpu_s = sum(parts[j.key][0] * (gpus_of.get(j.cell if j.kind == "train" else j.key, 0) if j.kind in
                                   ("train", "pack") else gpus.get(j.kind, 0)) for j in jobs)
    cost = {j.key: c.split(parts[j.key]) for j in jobs}
    slots = max(1, int(profile["jobs"]))
    start = c.split(c.scheduler)  # Snakemake's own start, before any job
    wall = start[0] / c.rate + start[1] + makespan(jobs, lambda j: cost[j.key], slots, c.machine, count_threads=shared)
    cores = int(c.sample.get("cores") or 1)
    idle = sum(start) + makespan(jobs, lambda j: cost[j.key], slots, (lambda k: min(1.0, cores / max(k, 1)))
                                 if shared else None, count_threads=shared)
    serial = sum(p[0] for p in parts.values()) + c.scheduler[0]
    notes += [f"{k} jobs: not measured by this doctor run, counted 0 s" for k in sorted(unmeasured)]
    return {
        "cells": len(cells), "steps": sum(x.config.train.steps for x in cells),
        "eval_jobs": sum(j.kind == "evaluate" for j in jobs), "jobs": rule_counts(jobs),
        "train_h": total("train", "pack", "publish") / 3600, "eval_h": total("evaluate") / 3600,
        "diagnostics_h": total("diagnose") / 3600, "aggregate_h": total("aggregate") / 3600,
        "base_h": total("base") / 3600, "serial_h": serial / 3600, "wall_h": wall / 3600,
        "wall_idle_h": idle / 3600, "concurrent_jobs": slots, "shared_machine": shared,
        "startup": describe(c), "schedule": as_rows(jobs, cost), "load": c.sample, "pack_max_cells": pack,
        "pack_places": places, "packs": pack_steps(cells, jobs, pack, places), "places_refused": places_refused(
            cells, jobs, places, m["device"].get("memory_gb", 0.0) if m["device"]["kind"] == "cuda" else 0.0),
        "scheduler": list(start), "waits": {k: {"mean_s": w, "jobs_recorded": n} for k, (w, n) in waits.items()},
        "gpu_hours": gpu_s / 3600, "gpus_per_job": gpus, "problem_counts": counts, "degenerate_rate": rate,
        "layout": {s: str(v) if v is not None else "CPU" for s, v in lay.items()}, "smoke_ranks": w0,
        "per_cell": detail, "assumptions": _assumptions(split, smoke_prompt, chosen, cells, m, lay, w0, gpus, slots,
                                                        shared, c, rate, notes),
    }


def _assumptions(split: dict, smoke_prompt: float, chosen: Any, cells: list, m: dict, lay: dict, w0: int,
                 gpus: dict, slots: int, shared: bool, c: Any, rate: float | None, notes: list[str]) -> list[str]:
    if not chosen.config.train.kl_monitor_every and any(x.config.train.kl_monitor_every for x in cells):
        notes.insert(0, "KL monitors: the smoke cell runs none (kl_monitor_every 0), so other cells' monitors are "
                        "counted 0 (run the doctor on a cell that monitors)")
    dapo = [x for x in cells if x.config.train.dynamic_sampling]
    if not dapo:
        refill = "no cell uses DAPO dynamic sampling: one generation round per step"
    elif rate is None:
        refill = (f"{len(dapo)} cells use DAPO dynamic sampling and the smoke run measured no degenerate-group "
                  "rate: each of their steps is charged its dynamic_sampling_max_batches rounds (the upper bound)")
    else:
        refill = (f"{len(dapo)} cells use DAPO dynamic sampling: the smoke's measured share of degenerate prompt "
                  f"groups (all rewards equal) p = {rate:.3g} holds for the whole run, groups independent, so a "
                  "step needs E[R] = 1 + sum_{r=1}^{M-1} P(Binomial(r P, 1 - p) < P) generation rounds "
                  "(M = dynamic_sampling_max_batches; early training is usually worse than later, and a cell that "
                  "learns more or less than the smoke cell refills less or more)")
    cap = {int(k): v for k, v in (c.sample.get("capacity") or {}).items()}
    machine = (f"the jobs share this machine's {c.sample.get('cores', '?')} CPUs with other users' work: while the doctor "
               f"job ran, its session got {cap.get(1, 1.0):.2f} CPUs with one runnable thread and "
               f"{cap.get(2, 2.0):.2f} with two (the kernel's fair share between sessions"
               f"{'' if c.sample.get('autogroups') else ' and threads'}, from {c.sample.get('samples', 0)} samples of "
               "the other users' runnable threads); the study's jobs, all in the session that starts Snakemake, get "
               "the same; the CPU-bound part of a job's measured time stretches with that share, the rest does "
               "not; the idle-machine figure is the same with no other users" if shared else
               "each job runs on its own allocation (no sharing between jobs), queue waits and requeues ignored")
    return [
        f"every job the study's run executes is counted (lorarl.pipeline.doctor.jobs, from workflow/rules): a "
        "base model job per missing local: recipe, a training job per cell (with pack: one job per pack, and the "
        "member's own train job waiting for it in a slot until the pack ends; with resident packs one such job per "
        "compatible group, lengths aside), an evaluation job per benchmark and snapshot step of "
        "each cell and base pseudo-cell, a diagnose job per cell, one aggregation",
        f"each launched job pays the start-up measured by this doctor run: a fresh `lorarl launch` "
        f"({c.launcher[0]:.3g}s, with the study's cell table), the submission and the job process's start, the "
        f"job reading the study, the launcher noticing its end ({c.overhead[0]:.3g}s in all); a model job "
        f"(train, evaluate, diagnose) also imports torch, transformers, peft and MLflow, opens the MLflow store "
        f"and loads the model for the first time ({c.stack[0]:.3g}s more); the first one also creates the "
        f"study's MLflow store ({c.store_once[0]:.3g}s); before the first job, Snakemake's own start (a dry run of "
        f"the study, {c.scheduler[0]:.3g}s); its bookkeeping between jobs is not counted",
        f"a step of the smoke cell costs {split['step_s']:.3g}s (warm-up step excluded); another cell's step is "
        "scaled part by part: generation by its completion budget P x G x max_completion_length, the rest of "
        "scoring (reward, old-policy forward) and the reference forward + policy forward/backward by its "
        "tokens P x G x (prompt + max_completion_length), each relative to the smoke cell's; what the smoke "
        "training spent beside its steps (model load, trainer, first use of TRL, saving, MLflow) is every "
        "training job's fixed part; a pack's members train one after another in its one job (no batching gain "
        "counted; a resident job's re-forms at its slot boundaries not charged): beside the hours, the report "
        "gives the pack-steps the packs run (lorarl.pipeline.doctor.packs)",
        f"prompt = the mean token length of a cell's training prompts (its tokenizer, task and prompt "
        f"settings; first {PROMPT_SAMPLE} prompts); the smoke cell's is {smoke_prompt:.1f}; completions are "
        "charged their full budget's share as in the smoke (same fill of max_completion_length)",
        refill,
        "a reference forward only in cells with beta > 0" + (
            "; the smoke cell (beta 0) measured none, so it is charged a third of the policy forward/backward "
            "of the rollout batch (forward:backward FLOPs 1:2)"
            if chosen.config.train.beta <= 0 and any(x.config.train.beta > 0 for x in cells) else ""),
        "KL monitors cost the measured run each kl_monitor_every steps; every job reloads the model "
        f"({m.get('model_load_s', 0.0):.3g}s)",
        "an evaluation job costs the model load and what the smoke's first problem cost beyond the rest (it is "
        "evaluated alone first) plus the smoke's warm seconds per problem (same protocol: n samples, token budget) "
        "times the benchmark's full problem count; snapshots cost as much as finals",
        "waits on a lock, a claim or a decision (the cost ledger's wait phase): each job is charged the mean wait "
        "of the study's recorded jobs of its kind (" + (", ".join(f"{k} {w:.3g}s over {n}" for k, (w, n) in
                                                           sorted(c.waits.items())) or "none recorded: 0 s") +
        "), not on the CPU; a wait on a free slot is the schedule's own",
        f"diagnostics: the smoke cell's {m.get('diagnose_s', 0.0):.3g}s per cell; aggregation: a fresh `lorarl "
        "aggregate` of the smoke study (its cost grows little with cells: docs/benchmarks.md); a base model: the "
        "doctor's own build of the smoke cell's base, when it built one",
        f"layout: training jobs on {lay['train'] or 'CPUs'} (the profile's slurm.train nodes x gpus_per_node); "
        f"the smoke trained on {w0} rank(s), a cell on W ranks (a teacher/PRM cell on one node of 2 GPUs: one "
        f"rank, the teacher/PRM on the second GPU): its step time x {w0}/W, assuming ideal data-parallel "
        "scaling of generation, scoring, reference forward and the update (each rank its share of the batch; "
        "gradient all-reduce, FSDP2 all-gathers and the slowest rank not charged: a lower bound); model "
        "loads, KL monitors, evaluations and diagnostics do not scale",
        f"GPU-hours = job seconds x the job's GPUs (nodes x gpus_per_node) per stage ({gpus}); wall time = the "
        f"jobs scheduled as Snakemake runs them: a job starts when the jobs it needs are done and one of the "
        f"profile's {slots} {'cores is free (each job takes its rule threads)' if shared else 'job slots is free'}; "
        + machine,
        *notes,
    ]
