"""`full`: full fine-tuning; with `mask`, only the masked-in entries of the target weights move."""

from __future__ import annotations

from typing import Any

from lorarl.adapters.names import MASKS
from lorarl.adapters.methods.common import expect_trainable
from lorarl.adapters.registry import Method, register


@register
class Full(Method):
    name = "full"
    summary = "full fine-tuning; with `mask`, only the masked-in entries of the target weights move"
    peft_type = None
    fields = ("mask", "mask_alpha", "mask_rank", "target_modules", "mask_low_alpha")
    defaults = {"mask": None, "mask_alpha": 0.5, "mask_rank": 16, "target_modules": "all-linear"}
    masks = MASKS
    UNIONS = ("safe", "random")  # masks with a low-magnitude part beside the principal one (mask_low_alpha)

    def applicable(self, values: dict) -> tuple[str, ...]:
        if values.get("mask") is None:
            return ("mask",)
        return self.fields if values["mask"] in self.UNIONS else self.fields[:-1]

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from lorarl.adapters.ops import apply_masks

        for p in model.parameters():
            p.requires_grad_(True)
        if a.get("mask"):
            apply_masks(model, a, ctx)
        return model

    def make_optimizer(self, model: Any, a: dict, ctx: Any) -> Any:
        if not a.get("mask"):
            return None
        from lorarl.adapters.ops import MaskedAdamW

        return MaskedAdamW.for_model(model, ctx.masks, lr=ctx.lr, weight_decay=ctx.weight_decay, betas=ctx.betas)

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = expect_trainable(obs)
        if obs.get("peft_type") is not None:
            p.append(f"full fine-tuning got a peft model ({obs['peft_type']})")
        if a.get("mask"):
            m = obs.get("masks") or {}
            if not m.get("matrices"):
                p.append(f"mask {a['mask']!r} requested but no masked weights")
            if obs.get("optimizer", {}).get("class") != "MaskedAdamW":
                p.append("a masked cell needs MaskedAdamW (frozen entries must not decay)")
        elif obs.get("trainable_fraction") != 1.0:
            p.append(f"full fine-tuning trains {obs.get('trainable_fraction')} of the parameters, not all")
        return p
