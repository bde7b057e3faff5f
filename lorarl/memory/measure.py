"""The measured peak of one real update on the CPU, beside the plan's figure for the same shape.

One update = lorarl's trainer (:func:`lorarl.train.trl_args.build_trainer`, its micro-batching and
checkpointing) on a generated rollout batch: ``compute_loss`` (every micro-batch's forward/backward but the
last), the last backward, AdamW's step. Measure: the bytes of the model's parameters and buffers held
before the update + the peak of ``torch.profiler``'s allocator events (``profile_memory=True``: every
tensor allocation and free on the CPU, summed in time order) during it, so gradients, AdamW's state
(created at the first step), activations and logits are counted where they are allocated.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any


def allocated_peak(fn: Any) -> tuple[int, Any]:
    """(peak bytes allocated above the start while ``fn()`` runs, its result), from the profiler's events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    total = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        total += e.nbytes()
        peak = max(peak, total)
    return peak, out


def tiny_trainer(model_dir: str, cfg: Any, out_dir: str) -> tuple[Any, Any]:
    """lorarl's trainer on the model in ``model_dir`` (CPU, fp32) with a constant outcome reward."""
    import datasets

    from lorarl.adapters import build_adapter
    from lorarl.models import load_model_and_tokenizer
    from lorarl.rewards.outcome import OutcomeDeposits
    from lorarl.train.prepare import reward_of
    from lorarl.train.trl_args import build_trainer, grpo_args

    model, tok = load_model_and_tokenizer(model_dir)
    policy = build_adapter(model, cfg, results_dir=out_dir, precision="fp32")
    ds = datasets.Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}=?\nA: ", "answer": str(30 + 2 * i)}
                                     for i in range(cfg.train.prompts_per_step)])
    regime, grading = reward_of(cfg, tok, out_dir, "cpu")  # the cell's own (an outcome reward's is replaced below)
    trainer = build_trainer(cfg, model=policy.model, tokenizer=tok, args=grpo_args(cfg, f"{out_dir}/o", use_cpu=True),
                            train_dataset=ds, ref_model=None, regime=regime, grading=grading)
    trainer.regime = OutcomeDeposits(score_fn=lambda c, a: [float(i % 2) for i in range(len(c))])
    trainer.current_gradient_accumulation_steps = 1
    return trainer, ds


def generated_batch(trainer: Any, ds: Any, generations: int) -> dict:
    import torch

    torch.manual_seed(0)
    trainer.model.train()
    return trainer._generate_and_score_completions([dict(ds[i]) for i in range(len(ds)) for _ in range(generations)])


def measure_update(trainer: Any, batch: dict) -> dict[str, float]:
    """Peak bytes (parameters + allocations) and seconds of one update of ``batch``."""
    model = trainer.model
    if trainer.optimizer is None:
        trainer.create_optimizer()
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])

    def update() -> float:
        t0 = time.perf_counter()
        loss = trainer.compute_loss(model, batch)
        trainer.accelerator.backward(loss)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    peak, seconds = allocated_peak(update)
    return {"peak_bytes": float(held + peak), "seconds": seconds}


def planned_update(cfg: Any, batch: dict, results_dir: str) -> dict[str, float]:
    """The plan's figure for the update phase of ``batch``'s actual shape (its prompt and completion widths)."""
    from lorarl.memory.plan import peak_bytes, shape_of

    shape, _ = shape_of(cfg, "cpu", results_dir)
    shape = replace(shape, prompt=int(batch["prompt_ids"].size(1)), completion=int(batch["completion_ids"].size(1)),
                    rows=int(batch["completion_ids"].size(0)))
    m = cfg.train.micro_batch_size if isinstance(cfg.train.micro_batch_size, int) else shape.rows
    got = peak_bytes(shape, min(m, shape.rows), 1, cfg.train.gradient_checkpointing == "on", True)
    return {"plan_bytes": got["static"] + got["phase_update"], "static": got["static"], "update": got["phase_update"]}
