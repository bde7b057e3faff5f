"""`lora_fa`: LoRA-FA: A frozen at init, B trained with peft's LoRA-FA optimiser."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.methods.common import LoraFamily
from lorarl.adapters.registry import register


@register
class LoraFA(LoraFamily):
    name = "lora_fa"
    summary = "LoRA-FA: A frozen at init, B trained with peft's LoRA-FA optimiser"
    freeze_A = True

    def make_optimizer(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft.optimizers import create_lorafa_optimizer

        opt = create_lorafa_optimizer(model, r=a["rank"], lora_alpha=a["alpha"], lr=ctx.lr,
                                      weight_decay=ctx.weight_decay)
        for group in opt.param_groups:  # peft writes transformers' default betas; train.adam_beta2 applies
            group["betas"] = ctx.betas
        return opt

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = super().expect(obs, a)
        if obs.get("optimizer", {}).get("class") != "LoraFAOptimizer":
            p.append(f"LoRA-FA needs peft's LoraFAOptimizer, got {obs.get('optimizer', {}).get('class')}")
        return p
