"""The memory plan of a study's evaluation jobs: the generation's KV cache at the longest budget.

An evaluation job (lorarl.evaluate) holds the weights it evaluates (merged adapter or full model) in the
inference dtype (bf16 on a GPU) and generates; its peak is the generation of its longest protocol
(``prompt + max_new_tokens`` tokens per sequence: Evalchemy's 32,768 new tokens make this the dominant part):

* ``eval.backend: hf``: ``eval.batch_size`` sequences at once (lorarl.evaluate.backends.HFBackend: one
  ``generate`` per chunk, left-padded to the chunk's longest prompt): their KV cache
  ``batch x tokens x layers x 2 x kv_heads x head_dim`` in the compute dtype, one layer's prefill
  activations and the sampling logits (fp32 values and probabilities of the last position);
* ``eval.backend: vllm``: the engine takes ``gpu_memory_utilization`` (vLLM's default 0.9) of the GPU and pages
  the KV cache; it starts with ``max_model_len``
  :func:`lorarl.language.evalplan.lengths.sequence_tokens` (lorarl.evaluate.main.make_backend; without
  it vLLM takes the model's whole context, 131,072 tokens for the Qwen2.5 / R1-distill models) and refuses to start
  unless the pool left after the weights holds one whole sequence of that length (vLLM's start-up check); the plan
  fits likewise, and runs as many whole sequences at once as the pool holds.

Prompts are charged ``train.max_prompt_length`` tokens (else lorarl.language.evalplan.lengths' assumption): a benchmark's
prompts are not read here. The budget is :data:`lorarl.memory.plan.HEADROOM` of the GPU, as for training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lorarl.memory.arch import arch_for
from lorarl.language.evalplan.lengths import longest_budget, prompt_tokens, sequence_tokens
from lorarl.memory.plan import GIB, HEADROOM, act_per_token_layer, largest

VLLM_UTILIZATION = 0.9  # vllm.LLM's default gpu_memory_utilization (the evaluate stage passes none)
MAX_BATCH = 1024  # the largest eval.batch_size the plan tries (a "max batch" beyond the configured one is room to spare)


@dataclass
class EvalPlan:
    cell: str  # the first cell of this evaluation shape
    cells: int  # how many cells share it
    model: str
    backend: str  # hf | vllm
    benchmark: str  # the benchmark of the longest budget
    tokens: int  # prompt + max_new_tokens of one sequence
    batch: int  # eval.batch_size (hf); vllm: the sequences the KV pool holds at once
    max_batch: int  # the largest batch that fits (hf); vllm: the same as batch
    kv_gb: float  # the KV cache of ``batch`` sequences (GiB)
    peak_gb: float  # projected peak of the evaluation job's GPU (GiB)
    fits: bool
    knobs: list[str] = field(default_factory=list)  # what to change when it does not fit
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def kv_bytes_per_token(arch: Any, cb: int = 2) -> int:
    """Keys and values of one token over every layer."""
    return arch.layers * 2 * arch.kv_heads * arch.hd * cb


def eval_peak(arch: Any, tokens: int, prompt: int, batch: int, device: str = "cuda") -> dict[str, float]:
    """HF generation of ``batch`` sequences of ``tokens`` tokens: weights, KV cache, prefill, logits (bytes)."""
    cb = 2 if device == "cuda" else 4
    parts = {"weights": float(arch.params() * cb), "kv_cache": float(batch * tokens * kv_bytes_per_token(arch, cb)),
             "prefill": batch * prompt * act_per_token_layer(arch, cb, prompt, device == "cuda"),
             "logits": float(batch * arch.vocab * 8)}
    return {**parts, "peak": sum(parts.values())}


def plan_eval(cfg: Any, gpu_memory_gb: float = 80.0, results_dir: str = "results", cell: str = "",
              cells: int = 1, device: str = "cuda") -> EvalPlan:
    """The evaluation plan of one cell config on one GPU of ``gpu_memory_gb`` GiB."""
    arch = arch_for(cfg.model, results_dir)
    bench = longest_budget(cfg)[0]
    prompt, note = prompt_tokens(cfg)
    tokens = sequence_tokens(cfg)
    budget = HEADROOM * gpu_memory_gb * GIB
    notes = [note] if note else []
    per_seq = tokens * kv_bytes_per_token(arch, 2 if device == "cuda" else 4)
    if cfg.eval.backend == "vllm":
        pool = VLLM_UTILIZATION * gpu_memory_gb * GIB - eval_peak(arch, tokens, prompt, 1, device)["weights"]
        held = max(int(pool // per_seq), 0)
        fits = held >= 1  # vLLM's start-up check: one sequence of max_model_len in the pool
        knobs = [] if fits else [f"a GPU with more memory: vLLM starts only when its pool holds one sequence of "
                                 f"max_model_len {tokens:,} tokens, {per_seq / GIB:.1f} GiB of KV cache beside "
                                 f"{arch.params() * 2 / GIB:.1f} GiB of weights"]
        return EvalPlan(cell, cells, cfg.model, "vllm", bench, tokens, held, held, held * per_seq / GIB,
                        VLLM_UTILIZATION * gpu_memory_gb, fits, knobs,
                        notes + [f"vLLM pages the KV cache: {held} sequence(s) of {tokens:,} tokens at once "
                                 f"(max_model_len {tokens:,})"])
    best = largest(lambda b: eval_peak(arch, tokens, prompt, b, device)["peak"] <= budget, max(cfg.eval.batch_size, MAX_BATCH))
    got = eval_peak(arch, tokens, prompt, cfg.eval.batch_size, device)
    fits = got["peak"] <= budget
    knobs = [] if fits else [f"eval.batch_size: {best} (the KV cache of {tokens:,}-token sequences, "
                             f"{per_seq / GIB:.2f} GiB each)" if best else
                             "even one sequence does not fit: a GPU with more memory, eval.backend: vllm or a smaller "
                             "max_new_tokens"]
    return EvalPlan(cell, cells, cfg.model, "hf", bench, tokens, cfg.eval.batch_size, best, got["kv_cache"] / GIB,
                    got["peak"] / GIB, fits, knobs, notes)


def eval_key(cfg: Any) -> str:
    """Everything :func:`plan_eval` reads: cells with equal keys have equal evaluation plans."""
    return json.dumps([cfg.model, cfg.eval.backend, cfg.eval.batch_size, longest_budget(cfg), prompt_tokens(cfg)[0]])


def plan_study_eval(study: str, gpu_memory_gb: float = 80.0, cell: str | None = None,
                    results_dir: str = "results") -> list[EvalPlan]:
    """One evaluation plan per distinct evaluation shape of the study's cells (or of the one cell ``cell``)."""
    from lorarl.language.study import find_cell, load_study, study_cells

    st = load_study(study)
    if st.kind != "grpo":
        return []
    chosen = [find_cell(st, cell)] if cell is not None else study_cells(st)
    groups: dict[str, list] = {}
    for c in chosen:
        groups.setdefault(eval_key(c.config), []).append(c)
    return [plan_eval(cs[0].config, gpu_memory_gb, results_dir, cs[0].id, len(cs)) for cs in groups.values()]


COLUMNS = ["cell", "cells", "model", "backend", "benchmark", "tokens/seq", "batch", "max batch", "KV GiB",
           "peak GiB", "fits"]


def eval_table(plans: list[EvalPlan]) -> str:
    rows = [COLUMNS] + [[p.cell, str(p.cells), p.model.split("/")[-1], p.backend, p.benchmark, f"{p.tokens:,}",
                         str(p.batch), str(p.max_batch), f"{p.kv_gb:.1f}", f"{p.peak_gb:.1f}", "yes" if p.fits else "NO"]
                        for p in plans]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def print_eval_plan(plans: list[EvalPlan], gpu_memory_gb: float, out: Any) -> int:
    """The evaluation jobs' table (one GPU each); 1 when one does not fit."""
    if not plans:
        return 0
    print(f"\nevaluation jobs: one GPU of {gpu_memory_gb:g} GiB each, the longest budget of each cell "
          f"(prompt + max_new_tokens); hf: eval.batch_size sequences' KV cache at once; vllm: its paged pool", file=out)
    print(eval_table(plans), file=out)
    for p in plans:
        for n in p.notes:
            print(f"  {p.cell}: note: {n}", file=out)
        if not p.fits:
            print(f"  {p.cell}: evaluation does not fit; fix: {'; '.join(p.knobs)}", file=out)
    return 0 if all(p.fits for p in plans) else 1


def device_eval_check(study: str, device: str, memory_gb: float, results_dir: str = "results") -> tuple[list, str]:
    """`lorarl doctor`'s check of the study's evaluation jobs on the device its job found: (the plans as dicts,
    one line). On a GPU an evaluation that does not fit raises, naming the knob; on a CPU the line only reports."""
    from lorarl.memory.arch import PlanError

    try:
        plans = plan_study_eval(study, memory_gb, results_dir=results_dir)
    except PlanError as err:
        return [], f"not planned: {err}"
    line = "; ".join(f"{p.cell}: {p.backend} {p.batch} x {p.tokens:,} tokens ({p.benchmark}), KV {p.kv_gb:.1f} GiB, "
                     f"peak {p.peak_gb:.1f} of {memory_gb:.1f} GiB" for p in plans)
    bad = [p for p in plans if not p.fits]
    if bad and device == "cuda":
        raise ValueError(f"evaluation does not fit this GPU: {line}; fix: "
                         + "; ".join(f"{p.cell}: {', '.join(p.knobs)}" for p in bad))
    return [p.as_dict() for p in plans], (line if device == "cuda" else f"CPU (host memory, not checked): {line}")
