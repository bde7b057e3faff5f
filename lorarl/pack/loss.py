"""Per-cell GRPO loss of a packed batch: TRL 1.16's clipped surrogate plus lorarl's own KL term.

For one cell's rows this is, term for term, what :class:`lorarl.train.trainer.LorarlGRPOTrainer` computes in
``_compute_loss`` for the loss types it supports (TRL's policy loss with TRL's ``beta`` at 0, plus
``beta * kl.aggregate(estimator)``), so a packed cell's loss and gradients equal the solo trainer's
(tests/pack/test_pack.py). Each cell is normalised over its OWN rows and tokens: cells never share a
denominator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lorarl.numerics import kl as klmod


@dataclass(frozen=True)
class LossSettings:
    """One cell's loss settings (the fields of its ``train:`` section that shape the loss)."""

    loss_type: str = "grpo"  # why: TRL's aggregation (grpo | bnpo | dr_grpo | dapo)
    beta: float = 0.0  # why: KL coefficient against the shared frozen base
    kl_estimator: str = "k3"  # why: lorarl.numerics.kl estimator of the per-token KL term
    kl_importance_correction: bool = True  # why: TRL's use_bias_correction_kl (KL term times pi/pi_old)
    epsilon_low: float = 0.2  # why: lower clip of the importance ratio
    epsilon_high: float = 0.2  # why: upper clip (DAPO's clip-higher when larger)
    importance_sampling_level: str = "token"  # why: TRL's token- or sequence-level ratio
    max_completion_length: int = 256  # why: dr_grpo's fixed normaliser
    delta: float | None = None  # why: TRL's two-sided (dual) clip of the ratio; None = off

    @classmethod
    def from_train(cls, t) -> "LossSettings":
        """From a cell's ``train:`` section (:class:`lorarl.language.config.TrainConfig`)."""
        return cls(loss_type=t.loss_type, beta=t.beta, kl_estimator=t.kl_estimator,
                   kl_importance_correction=t.kl_importance_correction, epsilon_low=t.epsilon,
                   epsilon_high=t.epsilon if t.epsilon_high is None else t.epsilon_high,
                   importance_sampling_level=t.importance_sampling_level,
                   max_completion_length=t.max_completion_length, delta=t.dual_clip)

    def check(self) -> None:
        if self.loss_type not in klmod.LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r}; allowed: {', '.join(klmod.LOSS_TYPES)}")
        klmod.estimator(self.kl_estimator)
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(f"importance_sampling_level {self.importance_sampling_level!r}; allowed: token, sequence")


EXTREMES = {"clip_ratio/low_min": min, "clip_ratio/high_max": max}  # stats merged over chunks by min/max, not means


def clip_stats(coef_1: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor, s: LossSettings) -> dict[str, float]:
    """TRL 1.16's ``clip_ratio/*`` of one cell (GRPOTrainer._compute_loss): the share of tokens whose ratio was
    clipped below (negative advantage) or above (positive advantage), and the extreme sequences' shares. The shares
    are means over the response tokens (a sequence-level ratio counts once per token, where TRL counts it once per
    sequence), so a cell's update in micro-batches reports what the whole update does (lorarl.pack.trainer)."""
    low = ((coef_1 < 1 - s.epsilon_low) & (adv_BT < 0)).float().expand_as(mask_BT)
    high = ((coef_1 > 1 + s.epsilon_high) & (adv_BT > 0)).float().expand_as(mask_BT)
    mean = lambda x: klmod.masked_mean(x, mask_BT).item()  # noqa: E731
    n_S = mask_BT.sum(-1)
    seq = lambda x: ((x * mask_BT).sum(-1) / n_S)[n_S > 0]  # noqa: E731  (TRL's masked_seq_mean, empty rows out)
    low_S, high_S = seq(low), seq(high)
    return {"clip_ratio/low_mean": mean(low), "clip_ratio/high_mean": mean(high),
            "clip_ratio/region_mean": mean(torch.maximum(low, high)),
            "clip_ratio/low_min": float(low_S.min()) if low_S.numel() else 0.0,
            "clip_ratio/high_max": float(high_S.max()) if high_S.numel() else 0.0}


def cell_loss(s: LossSettings, logp_BT: torch.Tensor, batch: dict,
              entropy_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """One cell's loss on its rows: ``batch`` holds ``completion_mask``, ``advantages`` ([B, T] or [B]),
    optional ``old_per_token_logps``, ``lorarl_ref_logps`` (when beta > 0), ``num_items_in_batch`` (dapo).
    ``entropy_BT``: the policy's per-token entropy, when the forward measured it (logged as ``entropy``)."""
    mask_BT = batch["completion_mask"]
    if "tool_mask" in batch:
        mask_BT = mask_BT * batch["tool_mask"]
    adv = batch["advantages"]
    adv_BT = adv.unsqueeze(1) if adv.dim() == 1 else adv
    old_BT = batch.get("old_per_token_logps")
    old_BT = logp_BT.detach() if old_BT is None else old_BT
    log_ratio_BT = logp_BT - old_BT
    if s.importance_sampling_level == "token":
        log_w = log_ratio_BT
    else:
        log_w = ((log_ratio_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - s.epsilon_low, 1 + s.epsilon_high)
    if s.delta is not None:
        coef_1 = torch.clamp(coef_1, max=s.delta)
    per_token_BT = -torch.min(coef_1 * adv_BT, coef_2 * adv_BT)
    n_items = batch.get("num_items_in_batch")
    if n_items is None:
        n_items = mask_BT.sum()
    # TRL's own expressions for the policy term (same operation order as GRPOTrainer._compute_loss)
    if s.loss_type == "grpo":
        loss = ((per_token_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1.0)).mean() / 1
    elif s.loss_type == "bnpo":
        loss = (per_token_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1.0) / 1
    elif s.loss_type == "dr_grpo":
        loss = (per_token_BT * mask_BT).sum() / (per_token_BT.size(0) * s.max_completion_length) / 1
    else:  # dapo
        normalizer = torch.as_tensor(n_items).clamp(min=1.0) / 1
        loss = (per_token_BT * mask_BT).sum() / normalizer
    stats: dict[str, float] = {"ppo_kl": klmod.masked_mean(klmod.ppo_kl(logp_BT.detach(), old_BT), mask_BT).item(),
                               **clip_stats(coef_1.detach(), adv_BT, mask_BT, s)}
    if entropy_BT is not None:  # TRL's `entropy`: of the policy's (temperature-scaled) next-token distribution
        stats["entropy"] = klmod.masked_mean(entropy_BT, mask_BT).item()
    if s.beta > 0:
        ref_BT = batch["lorarl_ref_logps"]
        weight_BT = klmod.importance_weight(logp_BT, old_BT, mask_BT, s.importance_sampling_level) \
            if s.kl_importance_correction else None
        kl_BT = klmod.per_token_kl(s.kl_estimator, logp_BT, ref_BT, weight_BT)
        term = klmod.aggregate(kl_BT, mask_BT, s.loss_type, max_completion_length=s.max_completion_length,
                               num_items_in_batch=n_items)
        loss = loss + s.beta * term
        stats["kl"] = klmod.masked_mean(kl_BT.detach(), mask_BT).item()
    return loss, stats
