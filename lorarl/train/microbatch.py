"""Micro-batched updates for the solo trainer: the same optimiser step in less memory.

``train.micro_batch_size`` = m sequences per forward/backward. One optimiser update is TRL's whole
per-device batch (the PPO mini-batch, or the rollout batch with one update per step); the mixin splits
it into chunks of m rows (the last one may be shorter), scales each chunk's loss by its exact share of
the update's normaliser and back-propagates chunk by chunk, so the gradients equal those of one
forward/backward over the batch (to float rounding) for every ``loss_type`` and both KL aggregations:

=========  ==================================================  =========================
loss_type  the update's loss (TRL 1.16 ``_compute_loss``)      chunk c's share
=========  ==================================================  =========================
grpo       mean over sequences of (token sum / length)          rows_c / rows
bnpo       token sum / tokens of the batch                      tokens_c / tokens
dr_grpo    token sum / (rows x max_completion_length)            rows_c / rows
dapo       token sum / tokens of the generation batch           1 (chunk-independent)
=========  ==================================================  =========================

``train.micro_batch_tokens`` = N token positions per forward/backward instead: the rows sorted by length
and grouped, each chunk cut to its longest row (:mod:`lorarl.train.tokenbudget`); the same shares apply, as
they depend on a chunk's rows and tokens, not on their order.

Why not TRL's own ``per_device_train_batch_size = m`` with ``gradient_accumulation_steps``: TRL divides
each chunk's grpo/bnpo/dr_grpo loss by the number of chunks, which equals the unbatched loss only for
equal chunks and, for bnpo, equal token counts per chunk; it also changes what ``steps_per_generation``
and TRL's step counters mean (the KL monitors, logging cadence and checkpoint boundaries count on them).
Here TRL keeps its batch shapes and counters; only the forward/backward is chunked.

Per-token and per-sequence terms (advantages, PPO ratios at either level, dual clip, the KL term and
its importance weight, vLLM's importance-sampling ratio) are row-local, so a chunk computes them alone.
Metrics TRL and lorarl log inside the loss (entropy, ``kl``, ``ppo_kl``, ``kl_ref/*``, clip ratios) are each
chunk's masked mean; after the chunks they are merged into the whole update's value (:func:`merge_chunks`:
weighted by each chunk's tokens, over all ranks; a clip ratio's min / max over sequences as the min / max), so
the logged row is the unbatched one's to float rounding (a plain mean of the chunks' means would move
``entropy`` by 7e-5 on the tiny test model, tests/pack/test_solo_pack.py). The KL monitors see the whole batch: the
chunks' log-probs are put back together.

Every log-prob forward (policy, old policy, reference) takes at most m rows at a time, so the logits
peak is bounded by the chunk; the fp32 log-softmax is TRL's, unchanged. Teacher and PRM forwards are
chunked by ``reward.teacher_batch_size`` / ``reward.prm_batch_size`` in their scorers.
"""

from __future__ import annotations

from typing import Any

import torch

from lorarl.train.tokenbudget import forward_rows, put_back, split_tokens

ROW_KEYS_SKIP = ("num_items_in_batch",)  # batch-level scalars every chunk shares


def micro_size(value: Any) -> int | None:
    """``train.micro_batch_size`` as the trainer uses it: an int, or None for the whole batch (``auto``
    unresolved, i.e. not on a GPU job, means the whole batch)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def split_rows(inputs: dict, m: int) -> list[dict]:
    """The batch dict cut into chunks of ``m`` rows (the last may be shorter); tensors whose first
    dimension is the batch are sliced, everything else (``num_items_in_batch``) is shared."""
    B = inputs["completion_ids"].size(0)
    chunks = []
    for lo in range(0, B, m):
        hi = min(lo + m, B)
        chunks.append({k: (v[lo:hi] if _is_row_tensor(k, v, B) else v) for k, v in inputs.items()})
    return chunks


def _is_row_tensor(key: str, v: Any, B: int) -> bool:
    return key not in ROW_KEYS_SKIP and isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == B


def chunk_share(loss_type: str, chunk_mask_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """The factor that turns a chunk's loss (as TRL aggregates it over the chunk alone) into its part of
    the whole batch's loss (table in the module docstring)."""
    if loss_type in ("grpo", "dr_grpo"):
        return chunk_mask_BT.size(0) / mask_BT.size(0)
    if loss_type == "bnpo":
        total = float(mask_BT.sum())
        return float(chunk_mask_BT.sum()) / total if total > 0 else 0.0
    if loss_type == "dapo":
        return 1.0
    raise ValueError(f"micro-batching supports loss_type grpo, bnpo, dr_grpo, dapo; got {loss_type!r}")


CHUNK_EXTREMES = {"clip_ratio/low_min": min, "clip_ratio/high_max": max}  # why: TRL logs these as a min / max over
# the update's sequences (so over the chunks' own), every other in-loss metric as a masked mean over its tokens
SEQUENCE_MEANS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")  # why: means over rows,
# not tokens, when importance_sampling_level is "sequence" (TRL's global_masked_mean of a [B, 1] ratio)


def merge_chunks(name: str, values: list[float], tokens: list[float], rows: list[float],
                 sequence_level: bool = False) -> float:
    """The whole update's value of an in-loss metric from its chunks' values: min / max for the clip ratios' extremes
    (NaN chunks, which have no sequence, skipped), else the mean weighted by each chunk's tokens (rows for a
    sequence-level clip ratio): what one forward/backward over the update logs."""
    if name in CHUNK_EXTREMES:
        kept = [v for v in values if v == v]
        return CHUNK_EXTREMES[name](kept) if kept else float("nan")
    weights = rows if sequence_level and name in SEQUENCE_MEANS else tokens
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights)) / max(total, 1.0)


def _mask(inputs: dict) -> torch.Tensor:
    mask_BT = inputs["completion_mask"]
    return mask_BT * inputs["tool_mask"] if "tool_mask" in inputs else mask_BT


class MicroBatching:
    """Mixin for :class:`lorarl.train.trainer.LorarlGRPOTrainer`: ``micro_batch_size`` rows per
    forward/backward, or ``micro_batch_tokens`` token positions (:mod:`lorarl.train.tokenbudget`; it wins when
    both are set); None = the whole batch, TRL's own path."""

    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    _micro_parts: list | None = None  # while a micro-batched update runs: its chunks' log-probs

    def _update_chunks(self, inputs: dict) -> list[tuple[list[int], dict]] | None:
        """The update's (rows, chunk) pairs: by token budget, else by rows; None: one forward/backward of the
        whole batch as it is (TRL's own path: no budget or micro-batch, or nothing to cut, or not training)."""
        if not (self.model.training and torch.is_grad_enabled()):
            return None
        m, B = self.micro_batch_size, inputs["completion_ids"].size(0)
        if self.micro_batch_tokens:
            chunks = split_tokens(inputs, self.micro_batch_tokens)
            whole = len(chunks) == 1 and chunks[0][1]["completion_ids"].shape == inputs["completion_ids"].shape
            return None if whole else chunks
        if not m or m >= B:
            return None
        return [(list(range(lo, min(lo + m, B))), c) for lo, c in zip(range(0, B, m), split_rows(inputs, m))]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        rows_chunks = self._update_chunks(inputs)
        if rows_chunks is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")
        mask_BT = _mask(inputs)
        chunks = [c for _, c in rows_chunks]
        done = torch.zeros((), device=mask_BT.device)
        logps = []
        logged = {k: len(v) for k, v in self._metrics["train"].items()}  # the in-loss metrics before the chunks
        self._micro_parts = logps  # _compute_loss appends each chunk's detached log-probs here
        try:
            for i, chunk in enumerate(chunks):
                loss = self._compute_loss(model, chunk) * chunk_share(self.loss_type, _mask(chunk), mask_BT)
                if i == len(chunks) - 1:  # the Trainer back-propagates the returned loss: the last chunk's graph
                    break
                self.accelerator.backward(loss)
                done = done + loss.detach()
        finally:
            self._micro_parts = None
        self._merge_chunk_metrics(logged, chunks)
        parts = [(rows, lp) for (rows, _), lp in zip(rows_chunks, logps)]
        self._remember_batch(inputs, put_back(parts, *mask_BT.shape), mask_BT)
        return loss + done  # value: the whole update's loss; gradient: the last chunk's (the rest is applied)

    def _merge_chunk_metrics(self, logged: dict[str, int], chunks: list[dict]) -> None:
        """Each in-loss metric the chunks logged once each becomes one entry, the whole update's
        (:func:`merge_chunks`; the chunks' tokens and rows summed over the ranks in one collective)."""
        n = len(chunks)
        counts = self._gsum(*[float(_mask(c).sum()) for c in chunks],
                            *[float(c["completion_ids"].size(0)) for c in chunks])
        tokens, rows = counts[:n], counts[n:]
        sequence_level = getattr(self, "importance_sampling_level", "token") == "sequence"
        metrics = self._metrics["train"]
        for name, values in metrics.items():
            before = logged.get(name, 0)
            if len(values) - before == n:
                values[before:] = [merge_chunks(name, values[before:], tokens, rows, sequence_level)]

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        m = self.micro_batch_size
        if self.micro_batch_tokens:  # at most the budget's positions of logits at once (widest rows: the batch's)
            ids = args[0] if args else kwargs["input_ids"]
            m = forward_rows(self.micro_batch_tokens, ids.size(1))
        if m and (kwargs.get("batch_size") is None or kwargs["batch_size"] > m):
            kwargs["batch_size"] = m  # at most m rows of full-vocabulary logits at once
        return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _remember_batch(self, inputs: dict, logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> None:
        """After an update's loss: keep its batch and log-probs for the KL monitors; a later pass over the
        same batch (num_iterations > 1) gives the previous update's KL(new || old) for free."""
        last = self._last_batch
        if last is not None and last[0] is inputs:
            self._log_kl_new_old(logp_BT, last[1], mask_BT, "/update")
        self._last_batch = (inputs, logp_BT)
        self._step_tokens += float(mask_BT.sum())
