"""Completion log-probs of a causal LM without the full-vocabulary logits of the whole sequence.

The pack's log-prob forwards (policy with grad, policy and frozen reference without) take the decoder's
last hidden states once, then project them onto the vocabulary a tile of tokens at a time: each tile's
logits are cast to fp32, divided by the rows' temperatures and log-softmaxed exactly as the whole
sequence's would be (the fp32 log-softmax stays where it was), and only the gathered ``[R, t]`` log-probs
are kept. With grad, each tile is checkpointed (non-reentrant): its logits are recomputed in the backward,
so the peak holds one tile's logits, not ``rows x completion x vocabulary`` of them.

Only for models whose logits are ``lm_head(hidden)`` (no final soft-capping or logit scale); any other
model gets ``None`` and its caller takes the whole-sequence path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

LOGIT_TOKENS = 4096  # tokens (rows x columns) of fp32 logits per tile, as TRL's fused head's 4,096-token tile

_SCALED = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _plain_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder body, lm_head) when the model's logits are exactly ``lm_head(last_hidden_state)``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    if cfg is None or any(getattr(cfg, a, None) not in (None, 1, 1.0) for a in _SCALED):
        return None
    get_decoder, head = getattr(base, "get_decoder", None), getattr(base, "lm_head", None)
    if get_decoder is None or head is None:
        return None
    return get_decoder(), head


def entropy_of(logp_RtV: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (nats) of the next-token distributions whose log-probs are ``logp_RtV`` (TRL's
    ``entropy_from_logits`` of the same temperature-scaled logits)."""
    return -(logp_RtV.exp() * logp_RtV).sum(-1)


def _tile(head: Any, h_RtH: torch.Tensor, ids_Rt: torch.Tensor, temp_R11: torch.Tensor | None,
          entropy: bool = False) -> Any:
    logits = head(h_RtH).float()
    if temp_R11 is not None:
        logits = logits / temp_R11
    logp = torch.log_softmax(logits, -1)
    picked = logp.gather(-1, ids_Rt.unsqueeze(-1)).squeeze(-1)
    return (picked, entropy_of(logp.detach())) if entropy else picked


def tiled_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                T: int, temp_R11: torch.Tensor | None = None, tokens: int = LOGIT_TOKENS,
                entropy: list | None = None) -> torch.Tensor | None:
    """``[R, T]`` log-probs of the last ``T`` tokens of each row (``None``: not a plain-head model, or one
    tile would cover the whole completion anyway). ``entropy``: a list that receives the ``[R, T]`` per-token
    entropies (detached), computed from each tile's logits."""
    R = input_ids.size(0)
    cols = max(1, tokens // max(R, 1))
    found = _plain_head(model) if cols < T else None
    if found is None:
        return None
    body, head = found
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False).last_hidden_state[:, -T - 1:-1]
    targets = input_ids[:, -T:]
    parts, ents = [], []
    want = entropy is not None
    for lo in range(0, T, cols):
        h, y = hidden[:, lo:lo + cols], targets[:, lo:lo + cols]
        if torch.is_grad_enabled() and hidden.requires_grad:
            got = checkpoint(_tile, head, h, y, temp_R11, want, use_reentrant=False)
        else:
            got = _tile(head, h, y, temp_R11, want)
        parts.append(got[0] if want else got)
        if want:
            ents.append(got[1])
    if want:
        entropy.append(torch.cat(ents, dim=1))
    return torch.cat(parts, dim=1)
