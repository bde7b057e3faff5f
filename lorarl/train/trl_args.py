"""The one translation of a cell config into TRL: every GRPOConfig field lorarl sets (`grpo_args`)
and the trainer's own options (`build_trainer`). Nothing changes `args` after `grpo_args` returns.

lorarl adds its own KL term, so TRL's ``beta`` is always 0 and the coefficient ``train.beta`` is a
constructor argument of :class:`lorarl.train.trainer.LorarlGRPOTrainer` (``kl_beta``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lorarl.language.config import CellConfig, RolloutConfig
    from lorarl.train.trainer import LorarlGRPOTrainer


def rollout_fields(rollout: "RolloutConfig | None", budget: int | None = None) -> dict[str, Any]:
    """TRL's vLLM fields of a GRPOConfig from the cell's ``rollout`` section. ``budget``: the cell's prompt +
    completion tokens, the engine's context when ``rollout.max_model_length`` is null (vLLM refuses to start a
    long-context model whose full context's KV cache does not fit its memory share)."""
    if rollout is None or rollout.engine != "vllm":
        return {"use_vllm": False}
    return {
        "use_vllm": True,
        "vllm_mode": rollout.vllm_mode,  # colocate: one process per cell, vLLM shares the trainer's GPU
        "vllm_gpu_memory_utilization": rollout.gpu_memory_utilization,
        "vllm_tensor_parallel_size": rollout.tensor_parallel_size,
        "vllm_enable_sleep_mode": rollout.sleep_mode,
        "vllm_max_model_length": rollout.max_model_length or budget,  # both null: the model's own context
        # the freshness gate needs the trainer's logprobs of the sampled tokens: TRL computes them only then
        "vllm_importance_sampling_correction": True,
        # the correction is part of the loss: chosen per cell, not TRL's defaults (its engine logprobs: engine_kwargs)
        "vllm_importance_sampling_mode": rollout.importance_sampling,
        "vllm_importance_sampling_clip_max": rollout.importance_sampling_cap,
        "vllm_importance_sampling_clip_min": rollout.importance_sampling_floor,
    }


def context_budget(t: Any) -> int | None:
    """Prompt + completion tokens of one rollout, or None when prompts have no limit (train.max_prompt_length)."""
    return t.max_prompt_length + t.max_completion_length if t.max_prompt_length else None


OPTIM = "adamw_torch_fused"  # why: HF's Trainer's optimiser for the solo job, named (not HF's default); adamw builds it


def adamw(params: Any, t: Any) -> Any:
    """The optimiser HF's Trainer builds from :func:`grpo_args` (``optim=OPTIM``: torch's fused AdamW, betas (0.9,
    ``adam_beta2``), eps 1e-8, ``weight_decay``), for a host that builds its own (lorarl.pack.build), so that a cell's
    update is the solo job's to the last bit (the for-loop AdamW rounds differently: up to 1e-6 after 3 steps)."""
    import torch

    return torch.optim.AdamW(params, lr=t.lr, betas=(0.9, t.adam_beta2), eps=1e-8, weight_decay=t.weight_decay,
                             fused=True)


def checkpointing(setting: str, use_cpu: bool) -> bool:
    """``train.gradient_checkpointing``: on, off, or auto = on for a cell that trains on a GPU."""
    return setting == "on" or (setting == "auto" and not use_cpu)


def grpo_args(cfg: "CellConfig", output_dir: str | Path, use_cpu: bool, precision: str | None = None,
              ranks: int | None = None) -> Any:
    """GRPOConfig from the cell config: one training step = one generation batch of P prompts x G
    completions, split into ``train.updates_per_generation`` PPO mini-batches and passed over
    ``num_iterations`` times (one optimiser update each). ``train.steps`` counts training steps (the
    papers' unit: paper 004 App. C.1 "steps of 4 gradient updates", verl's steps in paper 003), so TRL's
    ``max_steps`` (optimiser updates) is ``train.optimizer_updates``; warm-up and the schedule span those,
    and one logged row averages one step's updates. TRL's ``beta`` is 0: the KL coefficient goes to the
    trainer (``kl_beta``). ``ranks`` (default: this job's WORLD_SIZE): the processes one training job runs on;
    each gets ``1/ranks`` of every update's sequences, so the global batch is the study's on any layout
    (lorarl.train.ranks)."""
    from trl import GRPOConfig

    from lorarl.train import ranks as rankmod

    from lorarl.tasks.prompt import template_kwargs
    from lorarl.numerics.precision import autocast_bf16, resolve_precision
    from lorarl.train.sharding import fsdp_fields

    t = cfg.train
    n = rankmod.world_size() if ranks is None else int(ranks)
    update_rows = (t.mini_batch_prompts or t.prompts_per_step) * t.generations
    rankmod.check_layout(t.prompts_per_step, t.generations, update_rows, n)
    engine = rollout_fields(cfg.rollout, context_budget(t))  # engine vllm: TRL's colocated vLLM (use_vllm=True)
    fsdp = fsdp_fields(t.sharding, cfg.adapter.method, n)  # full fine-tuning on several ranks: FSDP2 (lorarl.train.sharding)
    # what the lower floors say of the cell, asked together: the precision's autocast, the chat template's kwargs
    precision = precision or resolve_precision(t.precision, "cpu" if use_cpu else "cuda")
    bf16 = autocast_bf16(precision)
    chat_template = template_kwargs(cfg.prompt) or None  # prompt.thinking: the chat template's enable_thinking
    return GRPOConfig(
        output_dir=str(output_dir),
        learning_rate=t.lr,
        max_steps=t.optimizer_updates,  # train.steps rollout steps x updates_per_step
        per_device_train_batch_size=update_rows // n,  # one update's sequences, split over the ranks
        ddp_timeout=rankmod.collective_timeout_s(),  # a dead rank fails the others after this, not a hang
        gradient_accumulation_steps=1,
        steps_per_generation=t.updates_per_generation,
        importance_sampling_level=t.importance_sampling_level,
        delta=t.dual_clip,
        num_generations=t.generations,
        max_completion_length=t.max_completion_length,
        temperature=t.temperature,
        top_p=t.top_p,
        beta=0.0,  # lorarl's own KL term (LorarlGRPOTrainer kl_beta = train.beta); TRL never runs a reference
        num_iterations=t.num_iterations,
        scale_rewards=t.scale_rewards,
        use_bias_correction_kl=t.kl_importance_correction,
        loss_type=t.loss_type,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        optim=OPTIM,  # the pack builds the same optimiser (adamw)
        weight_decay=t.weight_decay,
        adam_beta1=0.9,
        adam_beta2=t.adam_beta2,
        adam_epsilon=1e-8,
        max_grad_norm=t.max_grad_norm or 0.0,  # HF's Trainer clips only when > 0
        warmup_steps=t.warmup_ratio,  # < 1: a fraction of max_steps (the optimiser updates)
        lr_scheduler_type=t.lr_scheduler,
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=t.log_every * t.updates_per_step,  # log_every training steps
        logging_nan_inf_filter=False,  # a NaN/inf loss is logged as is (lorarl.numerics.divergence stops the cell)
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu,
        bf16=bf16,
        disable_tqdm=False,
        dataloader_num_workers=0,
        gradient_checkpointing=checkpointing(t.gradient_checkpointing, use_cpu),  # activations recomputed in the backward
        gradient_checkpointing_kwargs={"use_reentrant": False},  # works with frozen embeddings (PEFT) and no_grad forwards
        chat_template_kwargs=chat_template,
        **engine,
        **fsdp,
    )


def build_trainer(cfg: Any, *, model: Any, tokenizer: Any, args: Any, train_dataset: Any,
                  regime: Any, grading: Any, peft_config: Any = None, callbacks: list | None = None,
                  ref_model: Any = "auto") -> "LorarlGRPOTrainer":
    """The trainer of one cell: ``args`` from :func:`grpo_args` (unchanged here), the regime and grading settings
    its job resolved at the door (:func:`lorarl.train.prepare.prepare`, or :func:`lorarl.train.prepare.reward_of`
    for a test or the memory probe), KL, DAPO and memory options from the cell config, every one a constructor
    argument (nothing is set on the trainer afterwards)."""
    from lorarl.train.microbatch import micro_size
    from lorarl.train.prompt_fit import prompt_width
    from lorarl.tasks.prompt import prompt_keep
    from lorarl.train.trainer import LorarlGRPOTrainer

    t = cfg.train
    rollout = getattr(cfg, "rollout", None)
    return LorarlGRPOTrainer(
        model=model, regime=regime, args=args, kl_beta=t.beta, ref_model=ref_model, kl_estimator=t.kl_estimator,
        kl_monitor_every=t.kl_monitor_every, dynamic_sampling=t.dynamic_sampling,
        dynamic_sampling_max_batches=t.dynamic_sampling_max_batches,
        overlong_buffer=t.overlong_buffer, overlong_factor=t.overlong_factor, rollout=rollout, grading=grading,
        micro_batch_size=micro_size(t.micro_batch_size),  # rows per forward/backward (lorarl.train.microbatch)
        micro_batch_tokens=t.micro_batch_tokens,  # token positions per forward/backward (lorarl.train.tokenbudget)
        generation_engine=getattr(getattr(cfg, "runtime", None), "generation", None),  # hf: lorarl.decoding
        batch_invariant=bool(getattr(getattr(cfg, "runtime", None), "batch_invariant", False)),  # numerics.invariant
        # the prompt's facts last, together (lorarl.tasks.prompt): every rollout's prompt columns, and the last
        # max_prompt_length tokens a rollout keeps under train.prompt_overflow truncate_left
        prompt_width=prompt_width(cfg, tokenizer, list(train_dataset["prompt"])) if train_dataset is not None else None,
        prompt_keep=prompt_keep(t),
        train_dataset=train_dataset, processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
