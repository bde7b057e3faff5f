"""`lora_plus`: LoRA with the LoRA+ optimiser: lr_B = lr_ratio * lr_A (peft create_loraplus_optimizer)."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.methods.common import ADAM_EPS, LORA_DEFAULTS, LORA_FIELDS, LoraFamily
from lorarl.adapters.registry import register


@register
class LoraPlus(LoraFamily):
    name = "lora_plus"
    summary = "LoRA with the LoRA+ optimiser: lr_B = lr_ratio * lr_A (peft create_loraplus_optimizer)"
    fields = LORA_FIELDS + ("lr_ratio",)
    defaults = {**LORA_DEFAULTS, "lr_ratio": 16.0}

    def make_optimizer(self, model: Any, a: dict, ctx: Any) -> Any:
        import torch
        from peft.optimizers import create_loraplus_optimizer

        return create_loraplus_optimizer(
            model, torch.optim.AdamW, lr=ctx.lr, loraplus_lr_ratio=a["lr_ratio"],
            loraplus_weight_decay=ctx.weight_decay, betas=ctx.betas, eps=ADAM_EPS,
        )

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = super().expect(obs, a)
        lrs = obs.get("optimizer", {}).get("group_lrs", {})
        la, lb = lrs.get("lora_A"), lrs.get("lora_B")
        if la is None or lb is None or abs(lb - a["lr_ratio"] * la) > 1e-12 * max(1.0, lb):
            p.append(f"LoRA+ needs lr_B = {a['lr_ratio']} x lr_A; optimizer has lr_A={la}, lr_B={lb}")
        return p
