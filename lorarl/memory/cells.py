"""The memory plan of a study: one :class:`CellPlan` per distinct cell shape, with the knob that fixes it.

A cell fits when its projected peak (lorarl.memory.plan) at its own settings stays within ``HEADROOM`` of
the GPU: ``train.micro_batch_size`` (int, null = the whole update batch, auto = the largest that fits),
``train.micro_batch_tokens`` (token positions per forward: charged as its whole-width rows, at least one;
``max_micro_tokens`` is the largest budget that fits, the largest micro-batch times the charged sequence),
``train.gradient_checkpointing`` (auto = on: a GPU cell), ``rollout.generation_batch_size`` (int, null = the
whole rollout batch, auto = the largest that fits). The teacher / PRM share the policy's GPU unless the job
has a second one (``slurm.train.gpus_per_node: 2``; lorarl.memory.auto places them at job start). On a
layout of several GPUs (``gpus`` per node x ``nodes``) the figures are one rank's (lorarl.memory.ranks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from lorarl.memory.arch import PlanError
from lorarl.memory.ranks import Layout, has_aux, share, strategy_for
from lorarl.memory.plan import GIB, HEADROOM, Shape, aux_gpu_bytes, largest, peak_bytes, shape_of, static_parts

GPUS_KNOB = "slurm.train.gpus_per_node: 2 (the profile's train resources; teacher/PRM on the second GPU)"


@dataclass
class CellPlan:
    cell: str  # the first cell of this shape
    cells: int  # how many cells share it
    model: str
    method: str
    rows: int  # sequences per optimiser update
    batch: int  # sequences per rollout
    seq: int  # prompt + completion tokens charged
    micro_batch: int  # the micro-batch the cell runs with (auto resolved; 0 = none fits)
    generation_batch: int  # the generation chunk it runs with (auto resolved; 0 = none fits)
    checkpointing: bool
    peak_gb: float  # projected peak of the policy's GPU (GiB)
    aux_gpu_gb: float  # projected peak of the second GPU (0: none used)
    max_micro_batch: int  # the largest micro-batch that fits (10% headroom)
    max_generation_batch: int  # the largest generation chunk that fits
    fits: bool
    knobs: list[str] = field(default_factory=list)  # what to change when it does not fit
    parts_gb: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    gpus: int = 1  # GPUs per node of the layout planned
    nodes: int = 1
    ranks: int = 1  # training ranks (lorarl.memory.ranks.Layout.ranks)
    strategy: str = "single"  # single | ddp | fsdp2
    rank_rows: int = 0  # one rank's share of the update's rows (micro_batch is per rank)
    max_micro_tokens: int = 0  # the largest train.micro_batch_tokens that fits: max_micro_batch x seq


    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def shape_key(cfg: Any) -> str:
    """Everything the plan reads: cells with equal keys have equal plans."""
    from lorarl.rewards.registry import extra_models  # the teacher / PRM the regime loads (what the plan reads of it)

    t, r, rw = cfg.train, cfg.rollout, cfg.reward
    return json.dumps([cfg.model, cfg.task.name, cfg.adapter.model_dump(mode="json", include={"method", "rank",
                       "target_modules"}), t.prompts_per_step, t.generations, t.max_completion_length,
                       t.max_prompt_length, t.updates_per_generation, t.beta, t.kl_monitor_every, t.precision,
                       t.micro_batch_size, t.micro_batch_tokens, t.gradient_checkpointing, r.engine, r.generation_batch_size,
                       r.gpu_memory_utilization, r.sleep_mode, rw.regime,
                       [(x.role, x.model, x.dtype, x.batch_size) for x in extra_models(rw)]], sort_keys=True)


def _setting(value: Any, whole: int, best: int) -> int:
    if value == "auto":
        return best
    return whole if value is None else min(int(value), whole)


def plan_cell(cfg: Any, gpu_memory_gb: float = 80.0, gpus: int = 1, device: str = "cuda",
              results_dir: str = "results", cell: str = "", cells: int = 1, nodes: int = 1,
              world: int | None = None) -> CellPlan:
    """The plan of one cell config on ``nodes`` x ``gpus`` GPUs of ``gpu_memory_gb`` GiB each (device cpu: a
    CPU job); ``world``: the training ranks when known (a running job's), else the layout's rule."""
    layout = Layout(gpus, nodes)
    shape, notes = shape_of(cfg, device, results_dir)
    t, ro = cfg.train, cfg.rollout
    budget = HEADROOM * gpu_memory_gb * GIB
    ranks = layout.ranks(has_aux(cfg)) if world is None else world
    aux_here = not (shape.aux and ranks == 1 and layout.gpus >= 2)
    strategy = strategy_for(cfg.adapter.method, ranks, sum(static_parts(shape, aux_here).values())
                            + shape.vllm_share * gpu_memory_gb * GIB, budget, getattr(t, "sharding", "auto"))
    if ranks > 1:
        if ranks > shape.rows:
            raise PlanError(f"{ranks} training ranks but only {shape.rows} sequences per optimiser update: "
                            f"allowed: at most {shape.rows} GPUs (--gpus x --nodes)")
        if shape.rows % ranks:
            notes.append(f"{shape.rows} rows per update do not split evenly over {ranks} ranks: the largest "
                         f"share ({share(shape.rows, ranks)}) is planned")
        shape = replace(shape, rows=share(shape.rows, ranks), batch=share(shape.batch, ranks), world=ranks,
                        strategy=strategy)
    ckpt = t.gradient_checkpointing == "on" or (t.gradient_checkpointing == "auto" and device == "cuda")
    gen_whole = shape.batch if shape.engine == "hf" else 0

    def peak(m: int, g: int, c: bool = ckpt, here: bool = aux_here) -> dict:
        return peak_bytes(shape, m, g, c, here, gpu_memory_gb * GIB)

    best_m = largest(lambda m: peak(m, 1)["peak"] <= budget, shape.rows)
    best_g = largest(lambda g: peak(1, g)["peak"] <= budget, gen_whole) if gen_whole else 0
    seq = shape.prompt + shape.completion
    tokens = getattr(t, "micro_batch_tokens", None)  # a budget's forward holds at most its whole-width rows' positions
    m = min(max(tokens // seq, 1), shape.rows) if tokens else _setting(t.micro_batch_size, shape.rows, best_m)
    g = _setting(ro.generation_batch_size, gen_whole, best_g) if gen_whole else 0
    got = peak(max(m, 1), max(g, 1))
    aux_gb = aux_gpu_bytes(shape) / GIB if not aux_here else 0.0
    fits = m > 0 and (g > 0 or not gen_whole) and got["peak"] <= budget and aux_gb * GIB <= budget
    knobs = [] if fits else _knobs(shape, t, ro, peak, budget, best_m, best_g, m, g, ckpt, aux_here, aux_gb * GIB,
                                   gen_whole)
    parts = {k: round(v / GIB, 3) for k, v in got.items() if isinstance(v, float | int) and v}
    rows, batch = _global(cfg)
    return CellPlan(cell, cells, cfg.model, cfg.adapter.method, rows, batch,
                    shape.prompt + shape.completion, m, g, ckpt, got["peak"] / GIB, aux_gb, best_m, best_g, fits,
                    knobs, parts, notes + [f"worst phase: {got['worst_phase']}"], gpus, nodes, ranks, strategy,
                    shape.rows, best_m * seq)


def _global(cfg: Any) -> tuple[int, int]:
    """(rows per optimiser update, sequences per rollout) of the whole job."""
    t = cfg.train
    return t.prompts_per_step * t.generations // t.updates_per_generation, t.prompts_per_step * t.generations


def _knobs(shape: Shape, t: Any, ro: Any, peak: Any, budget: float, best_m: int, best_g: int, m: int, g: int,
           ckpt: bool, aux_here: bool, aux_bytes: float, gen_whole: int) -> list[str]:
    """The settings that make a cell fit, most specific first."""
    out = []
    floor = peak(1, 1)["static"]
    if aux_here and shape.aux and peak(1, 1)["peak"] > budget and peak(1, 1, here=False)["peak"] <= budget \
            and aux_gpu_bytes(shape) <= budget:
        return [GPUS_KNOB]  # nothing else fits the teacher/PRM beside the policy
    if aux_bytes > budget:
        out.append(f"the teacher/PRM alone need {aux_bytes / GIB:.1f} GiB on the second GPU: a GPU with more memory")
    if floor > budget:
        return out + [f"weights + optimiser state alone need {floor / GIB:.1f} GiB: a GPU with more memory "
                      f"(--gpu-memory-gb), more GPUs (--gpus / --nodes: FSDP2 shards them; "
                      f"lorarl.memory.layout.smallest_layout) or a smaller adapter/precision"]
    if not ckpt and m > best_m:
        with_ckpt = largest(lambda k: peak(k, 1, c=True)["peak"] <= budget, shape.rows)
        if with_ckpt >= min(m, 1) and with_ckpt > 0:
            out.append("train.gradient_checkpointing: on" + (
                f" (and train.micro_batch_size: {with_ckpt} or auto)" if with_ckpt < m else ""))
    if m > best_m or m == 0:
        out.append(f"train.micro_batch_size: {best_m} (or auto; or train.micro_batch_tokens: "
                   f"{best_m * (shape.prompt + shape.completion)})" if best_m else
                   "train.micro_batch_size: even 1 sequence does not fit: a GPU with more memory "
                   "(e.g. H200 141 GB) or shorter sequences")
    if shape.aux and aux_here and peak(max(min(m, best_m), 1), 1)["worst_phase"] == "scoring":
        out.append("reward.teacher_batch_size / reward.prm_batch_size: smaller (their forward is the peak)")
    if gen_whole and (g > best_g or g == 0):
        out.append(f"rollout.generation_batch_size: {best_g} (or auto)" if best_g else
                   "rollout.generation_batch_size: even 1 sequence does not fit: a GPU with more memory")
    return out


def plan_study(study: str, gpu_memory_gb: float = 80.0, gpus: int = 1, cell: str | None = None,
               results_dir: str = "results", device: str = "cuda", nodes: int = 1) -> list[CellPlan]:
    """One plan per distinct cell shape of the study (or of the one cell ``cell``), in cell order, on
    ``nodes`` x ``gpus`` GPUs per training job."""
    from lorarl.language.study import find_cell, load_study, study_cells

    from lorarl.language.study import cell_table

    st = load_study(study)
    if st.kind != "grpo":
        return []  # the toy study (lorarl.toy) computes on the CPU: no model, nothing to plan
    if cell is not None:
        try:
            chosen = [find_cell(st, cell)]
        except (KeyError, ValueError) as err:
            raise PlanError(f"--cell {cell!r}: {err}") from None
        if cell_table(st).is_base(chosen[0].id):
            raise PlanError(f"--cell {cell!r} is a base pseudo-cell (the untrained model): it trains nothing; "
                            f"allowed: a matrix cell ({', '.join(c.id for c in study_cells(st)[:5])}, ...)")
    else:
        chosen = study_cells(st)
    groups: dict[str, list] = {}
    for c in chosen:
        groups.setdefault(shape_key(c.config), []).append(c)
    return [plan_cell(cs[0].config, gpu_memory_gb, gpus, device, results_dir, cs[0].id, len(cs), nodes)
            for cs in groups.values()]


def device_projection(cfg: Any, kind: str, memory_gb: float, count: int, results_dir: str = "results") -> dict:
    """The plan's peak for ``cfg`` on the device a job found (`lorarl doctor` prints it beside the measured
    peak): {"peak_gb", "fits", ...}, or {"error"} when the plan cannot be made (an unknown model). The job's
    training ranks: ``WORLD_SIZE`` (torchrun's; 1 when unset), the rank's share of the batch on each."""
    import os

    device = "cuda" if kind == "cuda" else "cpu"
    world = int(os.environ.get("WORLD_SIZE") or 1)
    try:
        p = plan_cell(cfg, memory_gb, gpus=max(count, 1) if device == "cuda" else 1, device=device,
                      results_dir=results_dir, world=world if device == "cuda" else 1)
    except PlanError as err:
        return {"error": str(err)}
    return {"peak_gb": p.peak_gb, "fits": p.fits, "micro_batch": p.micro_batch, "generation_batch": p.generation_batch,
            "checkpointing": p.checkpointing, "parts_gb": p.parts_gb, "ranks": p.ranks, "strategy": p.strategy}


plan = plan_study  # the name lorarl.gpucheck looks for as well
