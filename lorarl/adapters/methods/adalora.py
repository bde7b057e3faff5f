"""`adalora`: AdaLoRA: P diag(E) Q, with peft's budgeted rank init_r=ceil(1.5 r) -> r, or at a fixed rank r.

`budget: allocate` (null): the AdaLoRA paper's method: init_r = ceil(1.5 r), peft's `update_and_allocate`
after every optimiser step and the orthogonality penalty on P and Q (lorarl.adapters.ops.AdaLoraCallback,
since a GRPO loss is not the forward's `outputs.loss` where peft adds it). `budget: fixed`: init_r = r and
neither: peft's AdaLoRA as TRL's stock trainer runs it (no callback calls `update_and_allocate`; the penalty
never reaches the GRPO loss), a fixed rank-r P diag(E) Q adapter: paper 002's run (the authors' code builds
`AdaLoraConfig(init_r=r, total_step=...)` and trains with TRL's stock trainer).
"""

from __future__ import annotations

import math
from typing import Any

from lorarl.adapters.methods.common import expect_kinds, expect_peft, expect_trainable, two_rank
from lorarl.adapters.registry import Method, register


def init_rank(a: dict) -> int:
    """The rank peft builds: ceil(1.5 r) under budget allocation, r at a fixed budget."""
    return a["rank"] if a.get("budget") == "fixed" else math.ceil(1.5 * a["rank"])


@register
class AdaLora(Method):
    name = "adalora"
    summary = "AdaLoRA: P diag(E) Q with budgeted rank init_r=ceil(1.5 r) -> r (peft AdaLoraConfig), or fixed at r"
    peft_type = "ADALORA"
    fields = ("rank", "alpha", "dropout", "target_modules", "budget")
    defaults = {"rank": 8, "alpha": two_rank, "dropout": 0.0, "target_modules": "all-linear"}

    @staticmethod
    def schedule(total: int) -> dict:
        """AdaLoRA phases from the cell's step count: 10% warm-up, 20% final fine-tuning."""
        return {"total_step": total, "tinit": total // 10, "tfinal": total // 5, "deltaT": 1}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import AdaLoraConfig, get_peft_model

        cfg = AdaLoraConfig(
            target_r=a["rank"], init_r=init_rank(a), lora_alpha=a["alpha"],
            lora_dropout=a["dropout"], target_modules=a["target_modules"], task_type="CAUSAL_LM",
            **self.schedule(ctx.total_steps),
        )
        return get_peft_model(model, cfg)

    def make_callbacks(self, model: Any, a: dict, ctx: Any) -> list:
        if a.get("budget") == "fixed":
            return []  # rank r throughout: no update_and_allocate, no orthogonality penalty
        from lorarl.adapters.ops import AdaLoraCallback

        return [AdaLoraCallback()]

    def expect(self, obs: dict, a: dict) -> list[str]:
        return (expect_peft(obs, "ADALORA") + expect_trainable(obs)
                + expect_kinds(obs, ("lora_A", "lora_B", "lora_E")))
