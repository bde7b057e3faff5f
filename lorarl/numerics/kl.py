"""Per-token KL estimators to a reference policy, and TRL's loss aggregations for a penalty term.

All estimators take the log-probabilities of the *sampled* tokens under the policy (``logp_BT``) and
the reference (``ref_BT``); the tokens were sampled from the policy.

* ``k1``: ``log pi - log pi_ref`` (unbiased for KL(pi || pi_ref), high variance, can be negative).
* ``k3``: ``exp(r) - r - 1`` with ``r = log pi_ref - log pi`` (TRL's estimator; unbiased, >= 0).
* ``one_sided``: ``max(pi * (log pi - log pi_ref), 0)`` (paper 001, appendix A, eq. 5): a
  probability-weighted, chosen-token, one-sided *penalty*. It is not a KL estimate; it is logged
  under its own name.

``importance_weight`` (TRL's ``use_bias_correction_kl``) multiplies the per-token term by the
importance ratio ``pi / pi_old`` (value 1 on-policy, but it carries a gradient): with it both k1
and k3 give an unbiased reverse-KL gradient; without it k1's expected gradient is zero.

``aggregate`` reduces a ``[B, T]`` per-token term exactly as TRL 1.16 reduces its policy loss for
each ``loss_type``, so ``loss + beta * aggregate(kl)`` equals TRL's loss with ``beta`` inside.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

ESTIMATORS = ("k1", "k3", "one_sided")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def k1(logp_BT: torch.Tensor, ref_BT: torch.Tensor) -> torch.Tensor:
    return logp_BT - ref_BT


def k3(logp_BT: torch.Tensor, ref_BT: torch.Tensor) -> torch.Tensor:
    # Same expression (and order of operations) as trl GRPOTrainer._compute_loss
    return torch.exp(ref_BT - logp_BT) - (ref_BT - logp_BT) - 1


def one_sided(logp_BT: torch.Tensor, ref_BT: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.exp(logp_BT) * (logp_BT - ref_BT), min=0.0)


_FUNCS = {"k1": k1, "k3": k3, "one_sided": one_sided}


def estimator(name: str):
    if name not in _FUNCS:
        raise ValueError(f"unknown KL estimator {name!r}; allowed: {', '.join(ESTIMATORS)}")
    return _FUNCS[name]


def per_token_kl(name: str, logp_BT: torch.Tensor, ref_BT: torch.Tensor,
                 importance_weight_BT: torch.Tensor | None = None) -> torch.Tensor:
    """The estimator's per-token value, optionally times the importance ratio ``pi / pi_old``."""
    out_BT = estimator(name)(logp_BT, ref_BT)
    return out_BT if importance_weight_BT is None else out_BT * importance_weight_BT


def importance_weight(logp_BT: torch.Tensor, old_BT: torch.Tensor, mask_BT: torch.Tensor,
                      level: str = "token") -> torch.Tensor:
    """``pi / pi_old`` as TRL's loss uses it: per token ``[B, T]``, or per sequence ``[B, 1]`` (the
    exponential of the mean log-ratio over the completion's tokens, TRL's ``"sequence"`` level)."""
    log_ratio_BT = logp_BT - old_BT
    if level == "token":
        return torch.exp(log_ratio_BT)
    if level == "sequence":
        m = mask_BT.to(log_ratio_BT.dtype)
        return torch.exp((log_ratio_BT * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0))
    raise ValueError(f"importance sampling level {level!r}; allowed: token, sequence")


def ppo_kl(logp_BT: torch.Tensor, old_BT: torch.Tensor) -> torch.Tensor:
    """verl's ``actor/ppo_kl`` per token: ``old - new`` log-prob of the sampled token, the log-ratio clamped to
    [-20, 20] as verl's ``compute_policy_loss`` does; its mean over a mini-batch's response tokens, taken in the
    loss forward before that mini-batch's update, is the KL(π_old‖π_new) k1 estimate verl logs (paper 003)."""
    return -(logp_BT - old_BT).clamp(-20.0, 20.0)


def masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean over the masked (response) tokens of the whole batch."""
    m = mask_BT.to(x_BT.dtype)
    return (x_BT * m).sum() / m.sum().clamp(min=1.0)


def aggregate(
    x_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    loss_type: str,
    *,
    max_completion_length: int | None = None,
    num_items_in_batch: torch.Tensor | float | None = None,
    grad_accum: int = 1,
    steps_per_generation: int = 1,
    num_processes: int = 1,
) -> torch.Tensor:
    """Reduce a per-token term like TRL 1.16's ``_compute_loss`` does for ``loss_type`` (train mode).

    grpo: mean over sequences of (sum over tokens / sequence length); bnpo: sum / tokens in this
    micro-batch; dr_grpo: sum / (B * max_completion_length); dapo: sum / tokens in the whole generation
    batch (``num_items_in_batch``). All but dapo are further divided by ``grad_accum``; dapo's
    normaliser is rescaled to one accumulation window, as TRL does.
    """
    m = mask_BT.to(x_BT.dtype)
    if loss_type == "grpo":
        return ((x_BT * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean() / grad_accum
    if loss_type == "bnpo":
        return (x_BT * m).sum() / m.sum().clamp(min=1.0) / grad_accum
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        return (x_BT * m).sum() / (x_BT.size(0) * max_completion_length) / grad_accum
    if loss_type == "dapo":
        if num_items_in_batch is None:
            raise ValueError("dapo needs num_items_in_batch (tokens in the generation batch)")
        n = torch.as_tensor(num_items_in_batch, dtype=x_BT.dtype, device=x_BT.device)
        normalizer = n.clamp(min=1.0) / num_processes * grad_accum / steps_per_generation
        return (x_BT * m).sum() / normalizer
    raise ValueError(f"KL penalty supports loss_type {', '.join(LOSS_TYPES)}; got {loss_type!r}")


def frozen_reference(model: Any) -> Any:
    """A frozen copy of the base policy: take it BEFORE any adapter is applied."""
    if hasattr(model, "peft_config"):
        raise ValueError("the reference must be copied from the base model before an adapter is applied; "
                         "got a PEFT-wrapped model")
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref.eval()


def reference_of(model: Any, precision: str, needed: bool) -> Any:
    """The KL reference of a training job: a frozen copy of ``model`` (the ORIGINAL base: call before any adapter), in
    bf16 unless training is fp32 (frozen: bf16 suffices, and halves it under full-FT mixed); None when not ``needed``."""
    if not needed:
        return None
    ref = frozen_reference(model)
    if precision != "fp32":
        ref.to(torch.bfloat16)
    return ref


def needs_reference(beta: float, kl_monitor_every: int) -> bool:
    """A reference policy is needed for the KL term (beta > 0) or the KL monitors."""
    return beta > 0 or kl_monitor_every > 0
