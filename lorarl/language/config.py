"""Typed configuration of one cell (one training run) of a study.

Every field carries a one-line comment saying *why* it exists. Unknown fields are errors
(`extra="forbid"`), so a typo in a study YAML never silently becomes a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from lorarl.adapters.names import INITS, MASKS, METHODS  # plain tuples; the registry is lorarl.adapters
from lorarl.decoding import RuntimeConfig  # pydantic only at import (torch inside its functions)
from lorarl.grading.overrides import AnswerFormat, GradingOverride, check_grading
from lorarl.rewards.section import RewardSection
from lorarl.language.prompt import BasePrompt, PromptConfig, check_base_prompts
from lorarl.sampler_logprobs import sampler_logprobs_mismatch
from lorarl.strict import Strict
from lorarl.language.task import TaskConfig

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")  # TRL's loss aggregations
Sequences = Annotated[int, Field(gt=0)]  # a positive number of sequences (memory knobs; or "auto" / null)


def one_of(value: str | None, allowed: tuple[str, ...] | list[str], what: str) -> str | None:
    """``value`` if it is one of ``allowed`` (or None); else an error naming it and the allowed values."""
    if value is not None and value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")
    return value


class AdapterConfig(Strict):
    """What is trained. null = the method's default (lorarl.adapters.describe()); a field that does
    not apply to the method must stay null (e.g. `init` with `ia3`), else the cell is rejected."""

    method: str = "lora"  # which parameter-efficient method (or `full`) is trained (lorarl.adapters)
    rank: int | None = Field(None, gt=0)  # adapter rank r (LoRA family 8, VeRA 256, MiSS 64)
    alpha: float | None = Field(None, gt=0)  # scaling numerator: scale = alpha/r (rslora alpha/sqrt r); 2r
    dropout: float | None = Field(None, ge=0, lt=1)  # adapter dropout; RL papers mostly use 0 or 0.05
    target_modules: str | list[str] | None = None  # which modules get adapters (default all-linear)
    init: str | None = None  # LoRA-family A0/B0 init (kaiming = peft default; pissa, rlpo, ...)
    lr_ratio: float | None = Field(None, gt=0)  # lora_plus: lr_B / lr_A (default 16)
    mask: str | None = None  # full only: sparse fine-tuning mask (principal, safe, ...)
    mask_alpha: float | None = Field(None, gt=0, lt=1)  # mask density alpha (default 0.5)
    mask_rank: int | None = Field(None, gt=0)  # rank k of the principal-mask SVD reconstruction (16)
    mask_low_alpha: float | None = Field(None, gt=0, lt=1, json_schema_extra={"signature_omits_default": True})  # safe/random masks: density of the low-magnitude part (null = mask_alpha); paper 004: 58.59% beside a 50% principal mask
    budget: Literal["allocate", "fixed"] | None = Field(None, json_schema_extra={"signature_omits_default": True})  # adalora: allocate = peft's budget allocation init_r ceil(1.5 r) -> r + orthogonality penalty; fixed = rank r, never reallocated, no penalty (TRL's stock trainer: paper 002's run); null = allocate

    @field_validator("method", "init", "mask")
    @classmethod
    def _known_name(cls, v: str | None, info: ValidationInfo) -> str | None:
        allowed = {"method": METHODS, "init": INITS, "mask": MASKS}[info.field_name]
        if info.field_name == "method" and v not in METHODS and (v in INITS or v in MASKS):  # pissa: an init, not a method
            other = "init" if v in INITS else "mask"
            base = "lora" if other == "init" else "full"
            raise ValueError(f"unknown method {v!r}: {v} is an adapter.{other}, not a method; write adapter.method: "
                             f"{base} and adapter.{other}: {v}; allowed methods: {', '.join(METHODS)}")
        return one_of(v, allowed, info.field_name)

    @model_validator(mode="after")
    def _fields_apply(self) -> "AdapterConfig":
        from lorarl.adapters.catalog import check_config  # pure python: no torch/peft

        check_config(self.model_dump())
        return self


class TrainConfig(Strict):
    lr: float = Field(1e-3, gt=0)  # learning rate; LoRA needs ~10x full fine-tuning's
    steps: int = Field(60, gt=0)  # training steps = rollout batches (the papers' unit); optimiser updates = steps x updates_per_step
    prompts_per_step: int = Field(8, gt=0)  # P: prompt groups per step
    generations: int = Field(4, ge=2)  # G: completions per prompt (group size, >= 2 for a std)
    max_completion_length: int = Field(48, gt=0)  # token budget per completion
    temperature: float = Field(1.0, gt=0)  # rollout sampling temperature
    top_p: float = Field(1.0, gt=0, le=1)  # rollout nucleus sampling
    beta: float = Field(0.0, ge=0)  # KL-to-reference coefficient (0 = KL-free GRPO)
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "grpo"  # TRL loss aggregation
    epsilon: float = Field(0.2, gt=0)  # PPO clip (lower side)
    epsilon_high: float | None = None  # DAPO clip-higher (upper side); None = symmetric
    weight_decay: float = Field(0.0, ge=0)  # AdamW weight decay
    adam_beta2: float = Field(0.999, gt=0, lt=1, json_schema_extra={"signature_omits_default": True})  # AdamW's second-moment decay (transformers' default; the GSM8K GRPO recipe, paper 000: 0.99)
    max_grad_norm: float | None = Field(1.0, gt=0, json_schema_extra={"signature_omits_default": True})  # clip the update's gradient to this L2 norm (transformers' default 1.0; the GSM8K GRPO recipe: 0.1); null = no clipping
    warmup_ratio: float = Field(0.0, ge=0, lt=1)  # linear warm-up fraction of the schedule
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"  # schedule shape
    log_every: int = Field(1, gt=0)  # metrics logging period in steps (one row averages the step's updates)
    checkpoint_every: int = Field(10, ge=0, json_schema_extra={"runtime": True})  # steps between resumable checkpoints (at rollout boundaries): a kill loses at most this (0 = none)
    keep_checkpoint: bool = Field(False, json_schema_extra={"runtime": True})  # keep the last checkpoint after the cell completes (else it is deleted)
    kl_estimator: Literal["k1", "k3", "one_sided"] = "k3"  # per-token estimator of the beta penalty (k3 = TRL's)
    kl_importance_correction: bool = True  # multiply the KL term by pi/pi_old, as TRL's use_bias_correction_kl
    kl_monitor_every: int = Field(10, ge=0)  # measure KL to the base and KL(new||old) every N steps (0 = never)
    scale_rewards: Literal["group", "none"] = "group"  # divide group-centred deposits by their std (Dr. GRPO: none)
    num_iterations: int = Field(1, gt=0)  # optimisation passes per generation batch (PPO epochs, mu)
    dynamic_sampling: bool = False  # DAPO: replace groups whose deposits are all equal by freshly sampled groups
    overlong_buffer: int = Field(0, ge=0)  # DAPO soft overlong penalty: ramp length in tokens (0 = off)
    overlong_factor: float = Field(1.0, ge=0)  # DAPO soft overlong penalty at the length limit
    dynamic_sampling_max_batches: int = Field(3, gt=0)  # DAPO refill: most generation rounds per step (then degenerate groups fill)
    precision: Literal["bf16-mixed", "fp32", "bf16-pure"] | None = None  # null = bf16-mixed on GPU, fp32 on CPU (resolved value logged)
    importance_sampling_level: Literal["token", "sequence"] = "token"  # PPO ratio per token, or per sequence (GSPO/TRL: mean log-ratio)
    dual_clip: float | None = Field(None, gt=1)  # dual-clip c for negative advantages (paper 003: 10; TRL's delta); null = off
    mini_batch_prompts: int | None = Field(None, gt=0)  # PPO mini-batch in prompts: prompts_per_step/this updates per rollout (003: 32 of 128)
    max_prompt_length: int | None = Field(None, gt=0)  # training prompts longer than this many tokens are dropped or cut (prompt_overflow; paper 002: 512)
    prompt_overflow: Literal["drop", "truncate_left"] = Field("drop", json_schema_extra={"signature_omits_default": True})  # a prompt over max_prompt_length: dropped, or its last tokens kept (verl's left truncation, papers 002/003/004)
    stop_on_collapse: bool = False  # end training at the first collapse flag (lorarl.train.flags); saves compute
    micro_batch_size: Sequences | Literal["auto"] | None = Field(None, json_schema_extra={"runtime": True})  # sequences per forward/backward, gradients accumulated over the update's batch (memory, not results); null = the whole batch, auto = the memory plan's on the job's GPU
    micro_batch_tokens: int | None = Field(None, ge=1, json_schema_extra={"runtime": True})  # token positions (padding included) per forward/backward, rows sorted by length and grouped (a longer row alone): a length-skewed batch pads less than by rows; null = by rows (micro_batch_size); set one of the two
    gradient_checkpointing: Literal["auto", "on", "off"] = Field("auto", json_schema_extra={"runtime": True})  # recompute activations in the backward (memory for time); auto = on for GPU cells
    sharding: Literal["auto", "ddp", "fsdp2"] = Field("auto", json_schema_extra={"runtime": True})  # several ranks: ddp = a full replica per rank, fsdp2 = weights/grads/optimiser sharded; auto = fsdp2 for full fine-tuning and for an adapter cell whose replica does not fit the job's GPU (memory plan), else ddp

    @model_validator(mode="after")
    def _check_overlong(self) -> "TrainConfig":
        if self.overlong_buffer >= self.max_completion_length:
            raise ValueError("overlong_buffer must be smaller than max_completion_length")
        if self.mini_batch_prompts is not None and self.prompts_per_step % self.mini_batch_prompts:
            raise ValueError(f"train.mini_batch_prompts ({self.mini_batch_prompts}) must divide "
                             f"train.prompts_per_step ({self.prompts_per_step})")
        rows = (self.mini_batch_prompts or self.prompts_per_step) * self.generations  # sequences of one update
        if isinstance(self.micro_batch_size, int) and self.micro_batch_size > rows:  # a short last chunk is fine
            raise ValueError(f"train.micro_batch_size ({self.micro_batch_size}) exceeds the update's {rows} sequences; allowed: 1..{rows}, null, auto")
        if self.micro_batch_tokens is not None and self.micro_batch_size is not None:
            raise ValueError(f"train.micro_batch_tokens ({self.micro_batch_tokens}) and train.micro_batch_size "
                             f"({self.micro_batch_size}) both set; allowed: one of the two (the other null)")
        if self.prompt_overflow == "truncate_left" and self.max_prompt_length is None:
            raise ValueError("train.prompt_overflow truncate_left needs train.max_prompt_length (how many tokens to keep)")
        if self.dual_clip is not None and self.dual_clip <= 1 + (self.epsilon_high or self.epsilon):
            raise ValueError(f"train.dual_clip must exceed 1 + the upper clip ({1 + (self.epsilon_high or self.epsilon)})")
        return self

    @property
    def updates_per_generation(self) -> int:
        """PPO mini-batches of one rollout batch (TRL's steps_per_generation)."""
        return self.prompts_per_step // (self.mini_batch_prompts or self.prompts_per_step)

    @property
    def updates_per_step(self) -> int:
        """Optimiser updates in one training step (= one rollout batch): mini-batches x PPO epochs."""
        return self.updates_per_generation * self.num_iterations

    @property
    def optimizer_updates(self) -> int:
        """Optimiser updates of the whole run (TRL's max_steps; warm-up and schedules span these)."""
        return self.steps * self.updates_per_step

    def signature_extras(self) -> dict[str, int]:
        """Derived settings the training signature adds to the dump (lorarl.language.signature): ``train.steps``
        counted optimiser updates before it counted rollout steps, so a cell whose two counts differ gets
        a new hash (its old results meant a quarter of the training), while every other cell keeps its own."""
        return {"updates_per_step": self.updates_per_step} if self.updates_per_step > 1 else {}


class RolloutConfig(Strict):
    """How rollouts are sampled during training (lorarl.train.rollout; engine vllm = TRL's colocated vLLM)."""

    engine: Literal["hf", "vllm"] = "hf"  # sampler: transformers generate (CPU/GPU) or vLLM in the trainer (a GPU, or vLLM's CPU build)
    gpu_memory_utilization: float = Field(  # vllm: share of GPU memory vLLM may take (memory, not results)
        0.3, gt=0, le=1, json_schema_extra={"runtime": True})
    tensor_parallel_size: int = Field(  # vllm: ranks per colocated engine (TRL's tensor-parallel groups; a layout: resolved per job, capped by its ranks)
        1, ge=1, json_schema_extra={"runtime": True})
    sleep_mode: bool = Field(  # vllm: free weights + KV cache during the optimiser step; re-pushed before sampling
        False, json_schema_extra={"runtime": True})
    max_model_length: int | None = Field(None, gt=0)  # vllm: context length; null = train.max_prompt_length + max_completion_length (the model's own when prompts have no limit)
    generation_batch_size: Sequences | Literal["auto"] | None = Field(None, json_schema_extra={"runtime": True})  # hf engine: sequences generated at once (KV-cache memory, not results); null = the whole batch, auto = the memory plan's
    enforce_eager: bool = False  # vllm: no CUDA graphs (less memory, slower; kernels differ, so it stays in the hash)
    freshness_threshold: float = Field(0.05, gt=0)  # vllm: mean |logp_sampler - logp_policy| (nats/token) above bf16 noise
    freshness_patience: int = Field(3, ge=1)  # vllm: consecutive stale steps before the cell stops with an error
    vllm_mode: Literal["colocate"] = Field(  # vllm: in the trainer's process on its GPU (where vLLM runs, not what it samples)
        "colocate", json_schema_extra={"runtime": True})
    logprobs_mode: Literal["processed", "raw"] = Field("processed", json_schema_extra={"signature_omits_default": True})  # vllm: the sampler's logprobs the IS ratio and freshness gate read: after temperature/top-p (renormalised over the nucleus; TRL's) or of the raw logits (before temperature)
    importance_sampling: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field("sequence_mask", json_schema_extra={"signature_omits_default": True})  # vllm: TRL's correction of sampler/trainer mismatch in the loss (ratios outside the bounds masked or clipped); TRL's default
    importance_sampling_cap: float | None = Field(3.0, gt=0, json_schema_extra={"signature_omits_default": True})  # vllm: upper bound of the IS ratio (TRL's 3.0); null = none
    importance_sampling_floor: float | None = Field(None, gt=0, json_schema_extra={"signature_omits_default": True})  # vllm: lower bound of the IS ratio; null = none (TRL's)

    def signature_extras(self) -> dict[str, int]:
        """``tensor_parallel_size`` is a layout (runtime) but was a signature field fixed at 1: the key stays, at 1,
        so the cells trained before keep their hashes."""
        return {"tensor_parallel_size": 1}

    @model_validator(mode="after")
    def _is_bounds(self) -> "RolloutConfig":
        if self.tensor_parallel_size > 1 and self.engine != "vllm":
            raise ValueError(f"rollout.tensor_parallel_size {self.tensor_parallel_size} needs rollout.engine 'vllm' "
                             "(ranks per vLLM engine); allowed with engine 'hf': 1")
        lo, hi = self.importance_sampling_floor, self.importance_sampling_cap  # TRL's GRPOConfig checks, named
        if (lo is None and hi is None and self.importance_sampling.endswith("truncate")) or (lo or 0) >= (hi or float("inf")):
            raise ValueError(f"rollout.importance_sampling {self.importance_sampling!r} needs importance_sampling_floor "
                             f"< importance_sampling_cap, at least one set for a truncate mode; got {lo} and {hi}")
        return self

    @field_validator("vllm_mode", mode="before")
    @classmethod
    def _server_refused(cls, v: Any) -> Any:
        if v == "server":
            raise ValueError(
                "'server' (TRL's `trl vllm-serve` on other GPUs) is not supported: lorarl pushes the effective "
                "weights and checks rollout freshness through TRL's colocated path only (one GPU per cell); "
                "allowed: colocate")
        return v


class ProtocolOverride(Strict):
    """A study's changes to a benchmark's registry protocol (null = keep the registry's value)."""

    kind: Literal["greedy", "sample"] | None = None  # decoding family (null: inferred from temperature)
    temperature: float | None = Field(None, ge=0)  # sampling temperature; 0 = greedy
    top_p: float | None = Field(None, gt=0, le=1)  # nucleus sampling mass
    max_new_tokens: int | None = Field(None, gt=0)  # completion budget (longer = truncated, graded as is)
    n: int | None = Field(None, ge=1)  # samples per problem (avg@n); pass@n unless ks is given
    ks: list[int] | None = None  # k values of the unbiased pass@k columns (each in [1, n])


class BenchmarkEval(Strict):
    """Where one benchmark's problems come from and how it is decoded (null = the registry's)."""

    path: str | None = None  # local .jsonl/.json/.parquet in the dataset's schema (no hub access needed)
    field_map: dict[str, str] = Field(default_factory=dict)  # registry column -> file column (other schemas)
    hub_id: str | None = None  # another hub dataset id in the same schema (a mirror or fork)
    subset: str | None = None  # hub dataset config name, e.g. gsm8k's "main"
    revision: str | None = None  # pin the hub revision so a dataset update cannot move the numbers
    split: str | None = None  # evaluate another split than the registry's
    limit: int | None = Field(None, gt=0)  # first N problems only (smoke runs; recorded in the summary)
    protocol: ProtocolOverride = ProtocolOverride()  # decoding/metric overrides of the registry protocol
    grading: GradingOverride = GradingOverride()  # math-verify comparison settings (recorded in each summary)
    headline: str | None = Field(None, json_schema_extra={"runtime": True})  # metric of this benchmark's headline column in tables, Avg and figures, e.g. pass@32 (paper 003 Table 1); null = the protocol's first (pass@1 / avg@n); report only: nothing is re-evaluated
    answer_format: AnswerFormat | None = None  # null = the study's reward.answer_format (prompt and grading agree); 003 grades GSM8K by its last number; multiple choice reads only a span format's (xml_*) span
    trained: bool | None = Field(None, json_schema_extra={"signature_omits_default": True})  # evaluate trained cells on it: null = the registry's (a benchmark measured before training, paper 001's envelope, only on the base and teacher rows)


class EvalConfig(Strict):
    max_new_tokens: int | None = Field(None, gt=0)  # budget for every benchmark (null: each protocol's; synthetic 48)
    batch_size: int = Field(64, gt=0, json_schema_extra={"runtime": True})  # generation batch size (memory, not results)
    benchmarks: dict[str, BenchmarkEval] | None = None  # held-out benchmarks (lorarl.grading.benchmarks registry); null = synthetic
    eval_every: int = Field(0, ge=0)  # save + evaluate adapter snapshots every N training (rollout) steps (pass@1-over-training curve)
    curve_benchmarks: list[str] | None = None  # benchmarks evaluated at each snapshot (null = all; []: none, diagnostics only)
    backend: Literal["auto", "hf", "vllm"] = "hf"  # generation engine (lorarl.evaluate.engines): vllm needs a GPU or vLLM's CPU build (else refused); auto: vllm where importable with a GPU, else hf
    teacher_benchmarks: list[str] | None = Field(None, json_schema_extra={"signature_omits_default": True})  # benchmarks the distillation teacher (reward.teacher) is evaluated on as a base row (paper 001 Table 2's teacher column)
    base_prompts: dict[str, BasePrompt] | None = Field(None, json_schema_extra={"signature_omits_default": True})  # a base row's own prompt settings: `base` (untrained student rows), `teacher` (lorarl.language.prompt)
    average: Literal["benchmarks", "samples"] = Field("benchmarks", json_schema_extra={"runtime": True})  # the report's Avg: the benchmarks' plain mean (paper 003), or the accuracy over all generated samples, each weighted by problems x samples (paper 002); report only

    @field_validator("base_prompts", mode="before")
    @classmethod
    def _base_rows(cls, v: Any) -> Any:  # keys: base, teacher (an unknown one is named with the allowed)
        return check_base_prompts(v)

    @field_validator("benchmarks", mode="before")
    @classmethod
    def _list_form(cls, v):  # `[gsm8k, math500]` is short for `{gsm8k: {}, math500: {}}`
        if isinstance(v, (list, tuple)):
            dup = sorted({b for b in v if list(v).count(b) > 1})
            if dup:
                raise ValueError(f"benchmark(s) listed twice: {', '.join(map(str, dup))}")
            return {b: {} for b in v}
        return {k: ({} if s is None else s) for k, s in v.items()} if isinstance(v, dict) else v

    def specs(self, synthetic: str) -> dict[str, BenchmarkEval]:
        """Benchmark name -> its settings; no `benchmarks:` = the synthetic held-out split (named `synthetic`)."""
        return {synthetic: BenchmarkEval()} if self.benchmarks is None else dict(self.benchmarks)

    @model_validator(mode="after")
    def _known_benchmarks(self) -> "EvalConfig":
        from lorarl.grading.resolve import check_eval_config  # names the field and the registered benchmarks

        check_eval_config(self)
        unknown = sorted(set(self.teacher_benchmarks or ()) - set(self.benchmarks or ()))
        if unknown:
            raise ValueError(f"eval.teacher_benchmarks: {', '.join(unknown)} not in eval.benchmarks "
                             f"({', '.join(self.benchmarks or ()) or 'none'})")
        return self


class CellConfig(Strict):
    model: str = "local:tiny-arith"  # `local:<recipe>` = built by the base rule; else an HF id or path
    seed: int = 0  # training seed (sampling, adapter init, data order)
    task: TaskConfig = TaskConfig()  # where prompts and gold answers come from
    prompt: PromptConfig = PromptConfig()  # how a problem is put to the model, in training and evaluation alike
    adapter: AdapterConfig = AdapterConfig()  # what is trained
    train: TrainConfig = TrainConfig()  # how it is trained (GRPO hyper-parameters)
    reward: SerializeAsAny[RewardSection] = Field(default_factory=lambda: _reward({}))  # which reward regime deposits the training signal: its regime's section (lorarl.rewards.section)
    rollout: RolloutConfig = RolloutConfig()  # which engine samples the training rollouts (hf | vllm)
    eval: EvalConfig = EvalConfig()  # how held-out accuracy is measured
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, json_schema_extra={"runtime": True})  # how the jobs run on their machine (the HF engine's KV cache and compiled decode: lorarl.decoding); never in a signature

    @model_validator(mode="before")
    @classmethod
    def _teacher_row(cls, data: Any) -> Any:
        """`eval.teacher_benchmarks` evaluates `reward.teacher` as a base row: a regime without a teacher (outcome,
        process) keeps it aside for that row (its signature counts it, its regime never sees it)."""
        ev = data.get("eval") if isinstance(data, dict) else None
        if not (ev.get("teacher_benchmarks") if isinstance(ev, dict) else getattr(ev, "teacher_benchmarks", None)):
            return data
        from lorarl.rewards.registry import aside_for_evaluation

        return {**data, "reward": aside_for_evaluation(data.get("reward", {}), ("teacher",))}

    @field_validator("reward", mode="before")
    @classmethod
    def _regime_section(cls, v: Any) -> RewardSection:
        return _reward(v)

    @model_validator(mode="before")
    @classmethod
    def _old_chat_template(cls, data: Any) -> Any:
        """Studies written before the prompt section: `eval.chat_template: true|false|null` moves to
        `prompt.chat_template: on|off|auto` (one setting now serves training and evaluation)."""
        if not isinstance(data, dict) or not isinstance(data.get("eval"), dict) or "chat_template" not in data["eval"]:
            return data
        data = {**data, "eval": dict(data["eval"])}
        old = data["eval"].pop("chat_template")
        new = {True: "on", False: "off", None: "auto"}.get(old, old)
        prompt = dict(data.get("prompt") or {})
        if prompt.get("chat_template", new) != new:
            raise ValueError(f"eval.chat_template={old!r} contradicts prompt.chat_template="
                             f"{prompt['chat_template']!r}; set prompt.chat_template only (auto, on, off)")
        prompt["chat_template"] = new
        data["prompt"] = prompt
        return data

    @model_validator(mode="after")
    def _rendered_template(self) -> "CellConfig":
        if self.task.prompt_rendered and (self.prompt.template or "{question}").count("{question}") != 1:
            raise ValueError("task.prompt_rendered needs a prompt.template with exactly one {question}")
        return self

    @model_validator(mode="after")
    def _benchmark_grading(self) -> "CellConfig":
        for name, spec in (self.eval.benchmarks or {}).items():
            check_grading(spec.grading, spec.answer_format or self.reward.answer_format,
                          f"eval.benchmarks.{name}.grading")
        return self

    @model_validator(mode="after")
    def _vllm_sampling(self) -> "CellConfig":
        if self.rollout.engine == "vllm" and self.train.temperature > 2.0:  # vLLM SamplingParams: [0, 2]
            raise ValueError(f"train.temperature {self.train.temperature} with rollout.engine vllm: vLLM accepts "
                             "temperatures in [0, 2]")
        why = sampler_logprobs_mismatch(self.rollout.logprobs_mode, self.train.temperature, self.train.top_p)
        if self.rollout.engine == "vllm" and why:
            raise ValueError(why)
        return self


def _reward(block: Any) -> RewardSection:
    """The ``reward:`` block validated by its regime's section (a union discriminated by ``regime`` over the
    regime registry: a regime registered later is a member too)."""
    from lorarl.rewards.registry import reward_section  # imports every regime module (light)

    return reward_section(block)
