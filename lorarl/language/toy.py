"""The cell config of a toy KL-bound study (what `lorarl.language.matrix` validates each toy cell against) and its
hyper-parameters (ASSUMPTIONS: `lorarl.toy.kl_bound`). No torch or scipy here: loading a toy study stays light."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from lorarl.strict import Strict

PAPER_RANKS = (1, 2, 4, 8, 16, 32, 64)


class KLBoundConfig(Strict):
    """Hyper-parameters of the toy study; defaults are the paper's §5.1 values."""

    model_config = ConfigDict(frozen=True)  # one default instance is shared by every ToyCellConfig: never changed in place

    d: int = Field(256, gt=0)  # output width of the adapted projection (d ≫ 1 avoids rank collapse)
    eval_fraction: float = Field(0.2, gt=0, lt=1)  # held-out share of Optdigits: the x_e of the KL
    pretrain_seed: int = 0  # fixes split and output code, hence the whole base
    pretrain_l2: float = Field(1e-2, ge=0)  # ridge on W0: strictly convex (unique W0), fast L-BFGS
    pretrain_iters: int = Field(300, gt=0)  # L-BFGS iteration cap for W0 (converges in ~60)
    epochs: int = Field(30, gt=0)  # LoRA fine-tuning epochs over the training split (paper: 30)
    batch_size: int = Field(64, gt=0)  # SGD mini-batch (paper: 64); last partial batch kept
    lr: float = Field(1e-8, gt=0)  # SGD learning rate η (paper: 1e-8), keeps the first-order regime
    clip: float | None = Field(1e-3, gt=0)  # max global grad norm over (A, B) (paper: 0.001); None = off
    optimizer: Literal["sgd", "adam"] = "sgd"  # the theorem's SGD, or Adam (torch defaults), see OPTIMIZERS
    adam_betas: tuple[float, float] = (0.9, 0.999)  # Adam moment decays (torch.optim.Adam defaults)
    adam_eps: float = Field(1e-8, gt=0)  # Adam denominator epsilon (torch default)
    init_std: float = Field(1.0, gt=0)  # std of A0, B0 entries; Theorem 1 (Assumption 1) needs 1
    subtract_init: bool = False  # freeze W0 − B0A0 so π_θ0 is the pretrained policy (see ASSUMPTIONS)
    ranks: tuple[int, ...] = PAPER_RANKS  # the study's rank grid (r ≤ min(d, k))
    seeds: tuple[int, ...] = tuple(range(20))  # LoRA-init/batch-order seeds per rank (paper: 20)


class ToyCellConfig(Strict):
    toy: KLBoundConfig = KLBoundConfig()  # the paper's §5.1 hyper-parameters (ranks/seeds come from axes)
    rank: int = Field(1, gt=0, le=64)  # LoRA rank r of the adapted 256x64 projection
    seed: int = 0  # LoRA init + batch order
