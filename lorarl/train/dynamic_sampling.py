"""DAPO dynamic sampling as DAPO does it: a step's batch is REFILLED with freshly sampled prompt
groups until it holds ``P`` groups whose rewards are not all equal (Yu et al., DAPO, eq. 11:
``0 < |{correct}| < G``), instead of dropping degenerate groups and training on a smaller batch.

The trainer (:mod:`lorarl.train.trainer`) scores one round of ``P`` prompts x ``G`` completions, keeps the
groups with signal, samples ``P`` more prompts while fewer than ``P`` are kept (at most
``train.dynamic_sampling_max_batches`` rounds, as DAPO's ``max_num_gen_batches``), then assembles
exactly ``P`` groups. When the rounds run out, degenerate groups of the first round fill the rest
(advantage 0: no gradient), counted in ``dynamic_sampling/frac_groups_degenerate``. The batch never
shrinks, so PPO mini-batches (``train.mini_batch_prompts``) stay valid.

Pure functions on the trainer's batch dicts (tensors ``[B, ...]`` with ``B = groups x G``, groups
contiguous) plus a seeded prompt sampler.

Test hook: LORARL_FAULT="flat_prompts:N" sets every reward deposit of the completions of a prompt whose
text's CRC-32 is divisible by N to 0 (a group every sample solves, or fails, alike: degenerate), so a tiny
model's dense rewards give the mix of degenerate and live groups that refills need, the same on any
number of ranks (it depends on the prompt's text alone).
"""

from __future__ import annotations

import random
import sys
import zlib
from typing import Any, Sequence

import torch

from lorarl.faulthooks import FAULT_ENV, number as fault_number

LEFT_PADDED = ("prompt_ids", "prompt_mask")  # prompts are left-padded; everything else right-padded


def take_groups(batch: dict[str, Any], groups: Sequence[int], group_size: int) -> dict[str, Any]:
    """The rows of ``groups`` (group indices, in that order) of one batch."""
    B = batch["completion_ids"].size(0)
    rows = [g * group_size + j for g in groups for j in range(group_size)]
    idx = torch.tensor(rows, dtype=torch.long, device=batch["completion_ids"].device)
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.size(0) == B:
            out[k] = v.index_select(0, idx)
        elif isinstance(v, list) and len(v) == B:
            out[k] = [v[i] for i in rows]
        else:
            out[k] = v
    return out


def _pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - x.size(1)
    if extra <= 0:
        return x
    pad = torch.full((x.size(0), extra, *x.shape[2:]), value, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def concat_batches(parts: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """Stack batches along B; 2-D tensors are padded to the widest part (prompts on the left with
    the pad token / mask 0, completions on the right; ids with the pad token, the rest with 0).
    ``num_items_in_batch`` is recounted from the merged loss mask."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    out: dict[str, Any] = {}
    sizes = [p["completion_ids"].size(0) for p in parts]
    for k, v in first.items():
        vals = [p.get(k) for p in parts]
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and all(
                isinstance(x, torch.Tensor) and x.size(0) == n for x, n in zip(vals, sizes)):
            if v.ndim >= 2:
                width = max(x.size(1) for x in vals)
                fill = pad_token_id if k.endswith("_ids") else 0
                vals = [_pad_to(x, width, fill, k in LEFT_PADDED) for x in vals]
            out[k] = torch.cat(vals, dim=0)
        elif isinstance(v, list) and all(isinstance(x, list) and len(x) == n for x, n in zip(vals, sizes)):
            out[k] = [y for x in vals for y in x]
        else:
            out[k] = v
    if "num_items_in_batch" in out:
        loss_mask = out["completion_mask"] * out.get("tool_mask", 1)
        out["num_items_in_batch"] = loss_mask.sum()
    return out


class PromptSampler:
    """Seeded draws of extra prompt groups from the training set (rows repeated G times, contiguous,
    as TRL's sampler lays out a generation batch). A draw depends only on (seed, step, round), so a
    resumed run refills exactly as an uninterrupted one."""

    def __init__(self, dataset: Any, seed: int):
        self.dataset = dataset
        self.seed = seed

    def draw(self, n_prompts: int, group_size: int, step: int = 0, round_: int = 1) -> list[dict]:
        rng = random.Random(f"{self.seed}:{step}:{round_}")
        n = len(self.dataset)
        picks = rng.sample(range(n), n_prompts) if n >= n_prompts else [rng.randrange(n) for _ in range(n_prompts)]
        return [dict(self.dataset[i]) for i in picks for _ in range(group_size)]


def plan_refill(kept: list[tuple[int, int]], degenerate: list[tuple[int, int]], want: int
                ) -> list[tuple[int, int]]:
    """(round, group) pairs forming the batch: the first ``want`` kept groups, then degenerate ones of
    the earliest rounds when too few were kept."""
    chosen = kept[:want]
    return chosen + degenerate[: want - len(chosen)]


def flat_prompts_fault(deposits: Any, prompts: Sequence[str]) -> None:
    """The ``flat_prompts:N`` test hook (module docstring): those prompts' completions' deposits set to 0."""
    n = fault_number("flat_prompts")
    if n is None:
        return
    flat = [i for i, p in enumerate(prompts) if zlib.crc32(p.encode()) % n == 0]
    for i in flat:
        deposits.values[i][:] = [0.0] * len(deposits.values[i])
    print(f"[lorarl] {FAULT_ENV}: {len(flat)} of {len(prompts)} completions' rewards set to 0", file=sys.stderr)
