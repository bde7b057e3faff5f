"""Reward deposits → per-token advantages: one rule for every regime.

Every regime (outcome, process, distillation) hands over the same thing: per completion, rewards
*deposited* at token positions. This module turns them into a ``[B, T]`` advantage tensor with one
rule that branches on deposit density, never on the regime (paper 001, appendix A, eq. 3-4):

1. Group-normalise all deposits of a prompt group: ``(r - mean) / (std + eps)`` over the group's
   deposits (Bessel-corrected std, as TRL; ``std = 0`` when a group holds a single deposit).
2. Sparse deposits (outcome, process): the advantage of token t is the reward-to-go, the sum of the
   normalised deposits at positions ``>= t`` (reverse cumsum).
   Dense deposits (distillation, one on every token): the normalised deposit is the advantage.

For the outcome regime (one deposit on the last token) step 2 copies the normalised scalar to every
token, which is exactly TRL's GRPO advantage.

Pure functions on tensors. Shape suffixes name the axes: ``B`` completions (= P prompts x G samples,
grouped contiguously as TRL does), ``T`` completion tokens, ``D`` deposits (flattened over the batch),
``P`` prompt groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ADV_EPS = 1e-4  # TRL's epsilon in (r - mean) / (std + eps)


@dataclass(frozen=True)
class GroupStats:
    """Per-group deposit statistics (what the normalisation used; also drives dynamic sampling)."""

    count_P: torch.Tensor  # deposits per group
    mean_P: torch.Tensor  # mean deposit per group
    std_P: torch.Tensor  # Bessel-corrected std per group (0 with fewer than 2 deposits)

    @property
    def degenerate_P(self) -> torch.Tensor:
        """Groups that carry no learning signal: all deposits equal (or none at all)."""
        return torch.isclose(self.std_P, torch.zeros_like(self.std_P)) | (self.count_P == 0)


def group_normalize(
    row_D: torch.Tensor,
    val_D: torch.Tensor,
    num_rows: int,
    group_size: int,
    eps: float = ADV_EPS,
    scale: bool = True,
) -> tuple[torch.Tensor, GroupStats]:
    """Normalise every deposit by its prompt group's deposit mean and std.

    row_D: completion index of each deposit; val_D: its value; completions ``g*G .. g*G+G-1`` form
    group g. ``scale=False`` subtracts the mean only (Dr. GRPO's / TRL's ``scale_rewards="none"``).
    Returns the normalised deposits ``norm_D`` and the group statistics.
    """
    if num_rows % group_size:
        raise ValueError(f"{num_rows} completions do not split into groups of {group_size}")
    n_groups = num_rows // group_size
    val_D = val_D.float()
    group_D = torch.div(row_D, group_size, rounding_mode="floor")
    zeros_P = torch.zeros(n_groups, dtype=val_D.dtype, device=val_D.device)
    count_P = torch.bincount(group_D, minlength=n_groups).to(val_D.dtype)
    mean_P = zeros_P.index_add(0, group_D, val_D) / count_P.clamp(min=1)
    dev_D = val_D - mean_P[group_D]
    # Same order of operations as trl.trainer.utils.nanstd: mean of squares, then * n / (n - 1)
    var_P = zeros_P.index_add(0, group_D, dev_D**2) / count_P.clamp(min=1)
    var_P = torch.where(count_P > 1, var_P * (count_P / (count_P - 1).clamp(min=1)), zeros_P)
    std_P = torch.sqrt(var_P)
    norm_D = dev_D / (std_P[group_D] + eps) if scale else dev_D
    return norm_D, GroupStats(count_P, mean_P, std_P)


def scatter_deposits(row_D: torch.Tensor, pos_D: torch.Tensor, val_D: torch.Tensor, num_rows: int,
                     num_tokens: int) -> torch.Tensor:
    """Deposits → ``[B, T]`` (deposits sharing a position add up)."""
    out_BT = torch.zeros(num_rows, num_tokens, dtype=val_D.dtype, device=val_D.device)
    if row_D.numel() == 0:
        return out_BT
    if int(pos_D.max()) >= num_tokens or int(pos_D.min()) < 0:
        raise ValueError(f"a deposit position lies outside the {num_tokens} completion tokens")
    return out_BT.index_put((row_D, pos_D), val_D, accumulate=True)


def reward_to_go(ndep_BT: torch.Tensor) -> torch.Tensor:
    """``out[b, t] = sum_{t' >= t} ndep[b, t']`` (reverse cumulative sum along T)."""
    return ndep_BT.flip(-1).cumsum(-1).flip(-1)


@dataclass(frozen=True)
class Advantages:
    adv_BT: torch.Tensor  # per-token advantages, zero outside the completion mask
    ndep_BT: torch.Tensor  # normalised deposits scattered to their positions
    stats: GroupStats  # group statistics of the raw deposits


def advantages_from_deposits(
    row_D: torch.Tensor,
    pos_D: torch.Tensor,
    val_D: torch.Tensor,
    mask_BT: torch.Tensor,
    group_size: int,
    dense: bool,
    eps: float = ADV_EPS,
    scale: bool = True,
) -> Advantages:
    """The single deposit → advantage rule (see module docstring).

    ``dense=True`` requires exactly one deposit on every completion token (``mask_BT``), otherwise a
    ValueError: density is a property of the deposits, checked here, not a label taken on trust.
    """
    num_rows, num_tokens = mask_BT.shape
    if dense:
        counts_BT = scatter_deposits(row_D, pos_D, torch.ones_like(val_D, dtype=torch.float32), num_rows,
                                     num_tokens)
        if not torch.equal(counts_BT, mask_BT.to(counts_BT.dtype)):
            raise ValueError("dense deposits must put exactly one deposit on every completion token")
    norm_D, stats = group_normalize(row_D, val_D, num_rows, group_size, eps=eps, scale=scale)
    ndep_BT = scatter_deposits(row_D, pos_D, norm_D, num_rows, num_tokens)
    adv_BT = ndep_BT if dense else reward_to_go(ndep_BT)
    return Advantages(adv_BT * mask_BT.to(adv_BT.dtype), ndep_BT, stats)
