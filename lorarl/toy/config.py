"""The cell config of a toy KL-bound study (what `lorarl.matrix` validates each toy cell against)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from lorarl.numbers import NoBoolNumbers

from lorarl.toy.kl_bound import KLBoundConfig


class ToyCellConfig(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid")
    toy: KLBoundConfig = KLBoundConfig()  # the paper's §5.1 hyper-parameters (ranks/seeds come from axes)
    rank: int = Field(1, gt=0, le=64)  # LoRA rank r of the adapted 256x64 projection
    seed: int = 0  # LoRA init + batch order
