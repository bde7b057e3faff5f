"""`vera`: VeRA: frozen shared random A, B; trained scaling vectors b (init 0), d (init 0.1)."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.methods.common import expect_kinds, expect_peft, expect_trainable
from lorarl.adapters.registry import Method, register


@register
class Vera(Method):
    name = "vera"
    summary = "VeRA: frozen shared random A, B; trained scaling vectors b (init 0), d (init 0.1)"
    peft_type = "VERA"
    fields = ("rank", "dropout", "target_modules")
    defaults = {"rank": 256, "dropout": 0.0, "target_modules": "all-linear"}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import VeraConfig, get_peft_model

        cfg = VeraConfig(r=a["rank"], vera_dropout=a["dropout"], target_modules=a["target_modules"],
                         d_initial=0.1, projection_prng_key=ctx.seed, save_projection=True,
                         task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    def expect(self, obs: dict, a: dict) -> list[str]:
        return (expect_peft(obs, "VERA") + expect_trainable(obs)
                + expect_kinds(obs, ("vera_lambda_b", "vera_lambda_d"), ("lora_A",)))
