"""`miss`: MiSS: one shard-shared matrix D expanded over W0 (peft MissConfig)."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.methods.common import expect_kinds, expect_peft, expect_trainable
from lorarl.adapters.registry import Method, register


@register
class Miss(Method):
    name = "miss"
    summary = "MiSS: one shard-shared matrix D expanded over W0 (peft MissConfig)"
    peft_type = "MISS"
    fields = ("rank", "dropout", "target_modules")
    defaults = {"rank": 64, "dropout": 0.0, "target_modules": "all-linear"}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import MissConfig, get_peft_model

        cfg = MissConfig(r=a["rank"], miss_dropout=a["dropout"], target_modules=a["target_modules"],
                         init_weights=True, task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    def expect(self, obs: dict, a: dict) -> list[str]:
        return expect_peft(obs, "MISS") + expect_trainable(obs) + expect_kinds(obs, ("miss_block",))
