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


def fused_head_logps(hidden_RLH: torch.Tensor, labels_RL: torch.Tensor, head: Any, temperature: float,
                     entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TRL's fused log-prob head (``trl.trainer.utils.add_fused_lm_head``, the solo job's) on one cell's rows:
    the decoder's last hidden states ``[R, L, H]`` and next-token labels ``[R, L]`` (-100: not scored) ->
    ``[R, L - 1]`` log-probs of the labels at the cell's ``temperature`` (0 where not scored), and the per-token
    entropy when asked (detached). The same kernel and the same arithmetic as the solo job's forward, so a cell's
    log-probs, loss and gradients are the solo job's bit for bit (docs/packed.md, "One cell, one result"); one
    call per cell, so each cell keeps its own temperature in one batched decoder forward."""
    from trl.kernels import ChunkedLogProbFunction
    from trl.kernels.chunked_logprob import _use_triton
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    h, y = hidden_RLH[:, :-1], labels_RL[:, 1:]
    mask = y != -100
    compact = _use_triton(h.device)  # TRL's rule: only the scored positions on Triton devices, every one elsewhere
    outputs = ("log_probs", "entropy") if entropy else ("log_probs",)
    per_token = ChunkedLogProbFunction.apply(
        h[mask] if compact else h.reshape(-1, h.size(-1)), head.weight, head.bias,
        y[mask] if compact else y.clamp(min=0).reshape(-1), float(temperature), _CHUNKED_LOGPROB_CHUNK_SIZE,
        None, 1.0, outputs)
    if compact:
        per_token = [None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x) for x in per_token]
    else:
        per_token = [None if x is None else x.view(mask.shape).masked_fill(~mask, 0) for x in per_token]
    ent = per_token[1].detach() if entropy and per_token[1] is not None else None
    return per_token[0], ent


def cell_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               T: int, rows: list[tuple[slice, float]], entropy: list | None = None) -> torch.Tensor | None:
    """``[R, T]`` log-probs of the last ``T`` tokens of each row through TRL's fused head, one decoder forward for
    all rows and one head call per cell (``rows``: each cell's row slice and temperature); ``None`` when the model's
    logits are not plain ``lm_head(hidden)``. ``entropy``: a list that receives the ``[R, T]`` entropies."""
    found = _plain_head(model)
    if found is None:
        return None
    body, head = found
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False).last_hidden_state
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-T] = -100
    parts, ents = [], []
    for sl, temp in rows:
        lp, ent = fused_head_logps(hidden[sl], labels[sl], head, temp, entropy is not None)
        parts.append(lp[:, -T:])
        if ent is not None:
            ents.append(ent[:, -T:])
    if entropy is not None and ents:
        entropy.append(torch.cat(ents))
    return torch.cat(parts)
