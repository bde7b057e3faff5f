"""`adalora`: AdaLoRA: P diag(E) Q with budgeted rank init_r=ceil(1.5 r) -> r (peft AdaLoraConfig)."""

from __future__ import annotations

import math
from typing import Any

from lorarl.adapters.methods.common import expect_kinds, expect_peft, expect_trainable, two_rank
from lorarl.adapters.registry import Method, register


@register
class AdaLora(Method):
    name = "adalora"
    summary = "AdaLoRA: P diag(E) Q with budgeted rank init_r=ceil(1.5 r) -> r (peft AdaLoraConfig)"
    peft_type = "ADALORA"
    fields = ("rank", "alpha", "dropout", "target_modules")
    defaults = {"rank": 8, "alpha": two_rank, "dropout": 0.0, "target_modules": "all-linear"}

    @staticmethod
    def schedule(total: int) -> dict:
        """AdaLoRA phases from the cell's step count: 10% warm-up, 20% final fine-tuning."""
        return {"total_step": total, "tinit": total // 10, "tfinal": total // 5, "deltaT": 1}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import AdaLoraConfig, get_peft_model

        cfg = AdaLoraConfig(
            target_r=a["rank"], init_r=math.ceil(1.5 * a["rank"]), lora_alpha=a["alpha"],
            lora_dropout=a["dropout"], target_modules=a["target_modules"], task_type="CAUSAL_LM",
            **self.schedule(ctx.total_steps),
        )
        return get_peft_model(model, cfg)

    def make_callbacks(self, model: Any, a: dict, ctx: Any) -> list:
        from lorarl.adapters.ops import AdaLoraCallback

        return [AdaLoraCallback()]

    def expect(self, obs: dict, a: dict) -> list[str]:
        return (expect_peft(obs, "ADALORA") + expect_trainable(obs)
                + expect_kinds(obs, ("lora_A", "lora_B", "lora_E")))
