"""`dora`: DoRA: magnitude m times direction (W0 + s B A)/||.||, peft use_dora."""

from __future__ import annotations

from lorarl.adapters.methods.common import LoraFamily
from lorarl.adapters.registry import register


@register
class Dora(LoraFamily):
    name = "dora"
    summary = "DoRA: magnitude m times direction (W0 + s B A)/||.||, peft use_dora"
    use_dora = True
