"""`rslora`: rsLoRA: scale alpha/sqrt(r), peft use_rslora."""

from __future__ import annotations

from lorarl.adapters.methods.common import LoraFamily
from lorarl.adapters.registry import register


@register
class RsLora(LoraFamily):
    name = "rslora"
    summary = "rsLoRA: scale alpha/sqrt(r), peft use_rslora"
    use_rslora = True
