"""`ia3`: IA3: learned rescaling vectors of K, V and the FFN input (peft IA3Config)."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.methods.common import expect_kinds, expect_peft, expect_trainable
from lorarl.adapters.registry import Method, register

IA3_CANONICAL = ("k_proj", "v_proj", "down_proj")  # K, V and the FFN input (Liu et al. 2022; paper 002 Tab. 1)
FEEDFORWARD_NAMES = ("down_proj", "fc2", "wo", "dense_4h_to_h", "c_proj")


@register
class IA3(Method):
    name = "ia3"
    summary = "IA3: learned rescaling vectors of K, V and the FFN input (peft IA3Config)"
    peft_type = "IA3"
    fields = ("target_modules",)
    defaults = {"target_modules": "canonical"}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import IA3Config, get_peft_model

        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = a["target_modules"]
        if targets == "canonical":
            targets = [t for t in IA3_CANONICAL if t in names]
            if not targets:
                targets = None  # peft's per-architecture default
        ff = None
        if isinstance(targets, list):
            ff = [t for t in targets if t in FEEDFORWARD_NAMES]
        cfg = IA3Config(target_modules=targets, feedforward_modules=ff, task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    def expect(self, obs: dict, a: dict) -> list[str]:
        return expect_peft(obs, "IA3") + expect_trainable(obs) + expect_kinds(obs, ("ia3_l",))
