"""`lora`: LoRA: W0 + (alpha/r) B A."""

from __future__ import annotations

from lorarl.adapters.methods.common import LoraFamily
from lorarl.adapters.registry import register


@register
class Lora(LoraFamily):
    name = "lora"
    summary = "LoRA: W0 + (alpha/r) B A"
