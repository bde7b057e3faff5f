"""`ln_tuning`: LayerNorm tuning: every norm layer's gain (and bias) trained (peft LNTuningConfig)."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.methods.common import expect_kinds, expect_peft, expect_trainable
from lorarl.adapters.registry import Method, register


@register
class LNTuning(Method):
    name = "ln_tuning"
    summary = "LayerNorm tuning: every norm layer's gain (and bias) trained (peft LNTuningConfig)"
    peft_type = "LN_TUNING"
    fields = ()

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import LNTuningConfig, get_peft_model

        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if "norm" in type(m).__name__.lower() and n})
        if not names:
            raise ValueError("ln_tuning: the model has no normalisation layers")
        return get_peft_model(model, LNTuningConfig(target_modules=names, task_type="CAUSAL_LM"))

    def expect(self, obs: dict, a: dict) -> list[str]:
        return expect_peft(obs, "LN_TUNING") + expect_trainable(obs) + expect_kinds(obs, ("ln_tuning_layers",))
