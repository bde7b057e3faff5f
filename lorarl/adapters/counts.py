"""Parameter counts of an adapter on a model shape, without building the model: what a cell's
`params_trainable`, `params_total` and `trainable_fraction` (lorarl.adapters.fingerprint) will be on a
published model whose weights are not here (tests/test_adapter_counts.py checks every method against a
real build on a tiny model).

`arch` is any object with `layers`, `hidden`, `kv_heads`, `hd`, `intermediate`, `params()` and
`linears()` -> [(name, in, out)] of one decoder layer (lorarl.memory.arch.Arch). `qkv_bias`: the q/k/v
projections carry biases (Qwen2 does; `Arch.params()` leaves biases out). `settings`: an adapter's
applied settings (lorarl.adapters.catalog.check_config), so defaults are already filled in.

What each method trains, as peft 0.21 builds it (and lorarl's methods configure it):
    full        every parameter
    lora family r (in + out) per target (lora_A, lora_B); DoRA adds a magnitude vector (out);
                LoRA-FA's lora_A is frozen but still a parameter
    adalora     R = ceil(1.5 r) (init_r; budget fixed: r): lora_A R x in, lora_B out x R, lora_E R; ranknum (1) frozen
    vera        lambda_b (out) + lambda_d (r) per target; the shared A, B are buffers, not parameters
    miss        miss_block r x out per target
    ia3         one vector per target: k_proj, v_proj outputs, down_proj's input (feed-forward)
    ln_tuning   each norm's gain, on a trainable copy (the frozen original stays: counted in the total)
"""

from __future__ import annotations

import math
from typing import Any

LORA_FAMILY = ("lora", "dora", "rslora", "lora_plus", "lora_fa")
IA3_TARGETS = ("k_proj", "v_proj", "down_proj")


def _targets(arch: Any, targets: Any) -> list[tuple[str, int, int]]:
    lin = arch.linears()
    if targets in (None, "all-linear"):
        return lin
    if isinstance(targets, str):
        targets = [targets]
    chosen = [x for x in lin if x[0] in targets]
    if not chosen:
        raise ValueError(f"adapter.target_modules={targets!r} names none of {[x[0] for x in lin]}")
    return chosen


def base_params(arch: Any, qkv_bias: bool = False) -> int:
    """The model's parameters before any adapter."""
    bias = arch.layers * (arch.linears()[0][2] + 2 * arch.kv_heads * arch.hd) if qkv_bias else 0
    return arch.params() + bias


def param_counts(arch: Any, settings: dict, qkv_bias: bool = False) -> tuple[int, int]:
    """(trainable, total) parameters of the adapted model (total: the base and every adapter parameter)."""
    base = base_params(arch, qkv_bias)
    method, L = settings["method"], arch.layers
    if method == "full":
        if settings.get("mask"):
            raise ValueError("adapter.mask: a masked full fine-tune's count needs the weights; allowed: mask null")
        return base, base
    if method in LORA_FAMILY:
        lin, r = _targets(arch, settings["target_modules"]), settings["rank"]
        a = L * sum(r * i for _, i, _ in lin)
        b = L * sum(r * o for _, _, o in lin)
        mag = L * sum(o for _, _, o in lin) if method == "dora" else 0
        trainable = b + mag + (0 if method == "lora_fa" else a)
        return trainable, base + a + b + mag
    if method == "adalora":
        r = settings["rank"]
        lin, R = _targets(arch, settings["target_modules"]), (r if settings.get("budget") == "fixed" else math.ceil(1.5 * r))
        trainable = L * sum(R * (i + o + 1) for _, i, o in lin)
        return trainable, base + trainable + L * len(lin)  # + ranknum, frozen
    if method == "vera":
        lin = _targets(arch, settings["target_modules"])
        trainable = L * sum(o + settings["rank"] for _, _, o in lin)
        return trainable, base + trainable
    if method == "miss":
        lin = _targets(arch, settings["target_modules"])
        trainable = L * sum(settings["rank"] * o for _, _, o in lin)
        return trainable, base + trainable
    if method == "ia3":
        targets = settings["target_modules"]
        names = IA3_TARGETS if targets == "canonical" else [x[0] for x in _targets(arch, targets)]
        sizes = {n: (i if n == "down_proj" else o) for n, i, o in arch.linears()}
        trainable = L * sum(sizes[n] for n in names)
        return trainable, base + trainable
    if method == "ln_tuning":
        trainable = (2 * L + 1) * arch.hidden  # two norms per layer and the final norm
        return trainable, base + trainable
    raise ValueError(f"adapter.method {method!r} has no count; allowed: full, adalora, vera, miss, ia3, ln_tuning, "
                     f"{', '.join(LORA_FAMILY)}")


def trainable_fraction(arch: Any, settings: dict, qkv_bias: bool = False) -> float:
    trainable, total = param_counts(arch, settings, qkv_bias)
    return trainable / total
