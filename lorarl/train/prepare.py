"""The door of a training job: a cell's inputs resolved ONCE, before anything trains.

    inputs = prepare(cfg, results_dir, output_dir=run.checkpoints.root)   # lorarl.train.main.train_cell

What a host needs to train one cell, resolved from the (job-resolved) cell config and nothing else: the
device and ``train.precision`` (resolved), the policy's base model and tokenizer (``train.precision``'s
load dtype), the frozen KL reference (a copy of the ORIGINAL base, taken before any adapter or residual
init touches it), the training set, the reward regime and the accuracy metric's grading settings, the
snapshot steps (``eval.eval_every``), the TRL arguments (:func:`lorarl.train.trl_args.grpo_args`) and whether
the weights shard (FSDP2). The trainer is then built from these (:func:`lorarl.train.trl_args.build_trainer`
takes the regime, it makes none) and nothing is set on it afterwards.

The pieces (:func:`load_policy`, :func:`reward_of`, :func:`lorarl.numerics.kl.reference_of`,
:func:`lorarl.tasks.trainset.training_dataset`) are the
pack's too (:func:`lorarl.pack.build.build_pack`: one base, one reference and one training set for K members,
a regime per reward setting), so a cell sees the same inputs in a solo job and in a pack.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

RUNTIME_KNOBS = (("train", "micro_batch_size"), ("rollout", "generation_batch_size"))  # may be `auto` in a study


@dataclass
class CellInputs:
    """One cell's training inputs, resolved at the door (:func:`prepare`)."""

    cfg: Any  # why: the cell config this job trains with (no `auto` left: job_config)
    device: str  # why: "cpu" or "cuda", where the policy trains
    precision: str  # why: train.precision resolved for the device (logged as resolved)
    model: Any  # why: the policy's base, loaded in the precision's dtype (the adapter wraps it)
    tokenizer: Any  # why: the base's tokenizer (prompts, decoding, saving a full model)
    ref_model: Any  # why: frozen copy of the ORIGINAL base for KL (None when neither beta nor the monitor needs it)
    dataset: Any  # why: the train split as TRL's dataset (prompt, answer)
    data_facts: dict  # why: prompts dropped/truncated, chat template: facts for summary.json
    regime: Any  # why: the reward regime (lorarl.rewards.registry.build_regime), built once here
    grading: Any  # why: answer format + math-verify settings of the accuracy metric (reward.*)
    args: Any  # why: TRL's GRPOConfig (lorarl.train.trl_args.grpo_args), unchanged after this
    sharded: bool  # why: full fine-tuning on several ranks trains FSDP2-sharded weights


def job_config(cell: Any, config: Any = None) -> Any:
    """The config this job trains with: ``config`` (the cell's, resolved for the job's GPUs where the job
    starts: lorarl.memory.auto.resolve_job), else the cell's own; either way with no ``auto`` left."""
    cfg = cell.config if config is None else config
    left = [f"{sec}.{name}" for sec, name in RUNTIME_KNOBS if getattr(getattr(cfg, sec), name) == "auto"]
    if left:
        raise ValueError(f"cell {cell.id}: {', '.join(left)} still auto; the job resolves it before training "
                         "(lorarl.memory.auto.resolve_job / job_cell, called by the stage that starts the job)")
    return cfg


def load_policy(cfg: Any, results_dir: str | Path, device: str, precision: str | None = None) -> tuple[Any, Any]:
    """Base model + tokenizer, loaded in the dtype ``train.precision`` asks for (lorarl.numerics.precision)."""
    import torch

    from lorarl.models import load_model_and_tokenizer, resolve_model
    from lorarl.numerics.precision import load_dtype, resolve_precision

    torch.manual_seed(cfg.seed)
    precision = precision or resolve_precision(cfg.train.precision, device)
    dtype = load_dtype(precision, cfg.adapter.method)
    return load_model_and_tokenizer(resolve_model(cfg.model, results_dir), dtype=dtype, device=device)


def reward_of(cfg: Any, tokenizer: Any, results_dir: str | Path, device: str) -> tuple[Any, Any]:
    """The cell's reward regime (a teacher's or PRM's model loaded on ``device``) and its grading settings."""
    from lorarl.models import resolve_model
    from lorarl.rewards.outcome import settings_of
    from lorarl.rewards.registry import build_regime

    regime = build_regime(cfg.reward, tokenizer, resolve=partial(resolve_model, results_dir=results_dir), device=device,
                          temperature=cfg.train.temperature)
    return regime, settings_of(cfg.reward)


def start_grading(cfg: Any) -> None:
    """Start the grading workers (lorarl.grading.pool) now, without waiting, when the cell grades with math-verify
    (``reward.answer_format: boxed``: the outcome reward and every regime's accuracy metric); the host waits for them
    before its first step (``CellRun.ready``), so the wait is the job's start-up, not step 1's time."""
    if cfg.reward.answer_format == "boxed":
        from lorarl.grading.pool import start_pool

        start_pool()


def prepare(cfg: Any, results_dir: str | Path, *, output_dir: str | Path) -> CellInputs:
    """Every input of one cell's solo run (``cfg``: :func:`job_config`'s). ``output_dir``: the cell's checkpoint
    folder (TRL's ``output_dir``: lorarl.train.checkpoint decides what is saved there and when)."""
    import torch

    from lorarl.train import ranks
    from lorarl.numerics.kl import needs_reference, reference_of
    from lorarl.numerics.precision import resolve_precision
    from lorarl.tasks.trainset import training_dataset
    from lorarl.train.sharding import uses_fsdp
    from lorarl.train.trl_args import grpo_args

    use_cpu = not torch.cuda.is_available()
    device = "cpu" if use_cpu else "cuda"
    start_grading(cfg)  # the grading workers start beside the model load, not inside step 1
    sharded = uses_fsdp(cfg.train.sharding, cfg.adapter.method, ranks.world_size())
    model, tok = load_policy(cfg, results_dir, device)  # in train.precision's load dtype
    with torch.random.fork_rng(devices=[] if use_cpu else [torch.cuda.current_device()]):
        regime, grading = reward_of(cfg, tok, results_dir, device)  # a teacher/PRM load leaves the adapter's init stream alone
    # then what the lower floors make of the cell, asked together, each once: the precision and the KL reference (the
    # ORIGINAL base: no adapter yet), the training set (prompts rendered as evaluation renders them)
    precision = resolve_precision(cfg.train.precision, device)
    ref = reference_of(model, precision, needs_reference(cfg.train.beta, cfg.train.kl_monitor_every))
    dataset, facts = training_dataset(cfg, tok)
    return CellInputs(cfg=cfg, device=device, precision=precision, model=model, tokenizer=tok, ref_model=ref,
                      dataset=dataset, data_facts=facts, regime=regime, grading=grading,
                      args=grpo_args(cfg, output_dir, use_cpu, precision), sharded=sharded)
