"""Token-budget micro-batches (``train.micro_batch_tokens``): which rows of an update share a forward/backward.

An RLVR batch is length-skewed (a few completions run to the length limit among short ones). Chunks of m rows
(``train.micro_batch_size``) pad every chunk to the batch's full width, so the memory bound is m x the longest
row and most of the compute is padding. Here the rows are sorted by length, longest first, and filled greedily
(verl's ``use_dynamic_bsz`` and OpenRLHF's packing both start from a per-forward token budget): a chunk takes
the next rows while ``rows x its longest row <= budget``; a row longer than the budget goes alone. Each chunk is
then trimmed to its own longest row, so a forward holds at most ``budget`` token positions, padding included.

What is trimmed: the completion's right padding (columns after the chunk's last completion token). The
prompt's left padding stays: TRL 1.16's log-prob forward passes no ``position_ids``, so a model's positions
are the column indices; cutting left columns would move every position and change the logits against the
unchunked update. Padding-free packing (several rows in one sequence, ``position_ids`` restarting per row)
needs flash-attention's varlen kernels, which the pinned transformers offers on CUDA only; on CPU the trimmed
chunk is the whole gain.

The loss normalisation is :func:`lorarl.train.microbatch.chunk_share`'s: a chunk's share depends on its rows
(grpo, dr_grpo) or tokens (bnpo), never on which rows or in what order, so the sum of the chunks' gradients is
the unchunked gradient for every loss type and KL aggregation (tests/train/test_token_microbatch.py).
"""

from __future__ import annotations

from typing import Any

import torch

PROMPT_KEYS = ("prompt_ids", "prompt_mask")  # left-padded: kept whole (module docstring)
ROW_KEYS_SKIP = ("num_items_in_batch",)  # batch-level scalars every chunk shares


def row_lengths(inputs: dict) -> list[int]:
    """Each row's forward length once its completion's right padding is cut: the prompt's width plus the
    position after its last completion token (``completion_mask``; a tool mask only removes tokens inside it)."""
    mask_BT = inputs["completion_mask"]
    T = mask_BT.size(1)
    pos_T = torch.arange(1, T + 1, device=mask_BT.device)
    ends_B = (mask_BT.ne(0) * pos_T).amax(dim=1) if T else torch.zeros(mask_BT.size(0), dtype=torch.long)
    return [inputs["prompt_ids"].size(1) + int(e) for e in ends_B.tolist()]


def plan_chunks(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices of each chunk: rows sorted longest first (ties by index), filled greedily while
    ``rows x the chunk's longest row <= budget``; a row over the budget alone."""
    if budget < 1:
        raise ValueError(f"train.micro_batch_tokens must be at least 1; got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    chunks: list[list[int]] = []
    for i in order:
        if chunks and (len(chunks[-1]) + 1) * lengths[chunks[-1][0]] <= budget:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def take_rows(inputs: dict, rows: list[int], width: int) -> dict:
    """The chunk's batch: the rows ``rows`` of every row tensor; completion-aligned tensors (every row tensor
    but the prompt's whose second dimension is the completion's) cut to the first ``width`` columns."""
    B, T = inputs["completion_ids"].shape
    idx = torch.tensor(rows, dtype=torch.long, device=inputs["completion_ids"].device)
    out = {}
    for k, v in inputs.items():
        if not _is_row_tensor(k, v, B):
            out[k] = v
            continue
        v = v.index_select(0, idx.to(v.device))
        out[k] = v[:, :width] if k not in PROMPT_KEYS and v.dim() >= 2 and v.size(1) == T else v
    return out


def _is_row_tensor(key: str, v: Any, B: int) -> bool:
    return key not in ROW_KEYS_SKIP and isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == B


def split_tokens(inputs: dict, budget: int) -> list[tuple[list[int], dict]]:
    """The update's batch as token-budget chunks: (rows, the chunk's trimmed batch) in plan order."""
    lengths = row_lengths(inputs)
    Tp = inputs["prompt_ids"].size(1)
    return [(rows, take_rows(inputs, rows, max(lengths[rows[0]] - Tp, 1))) for rows in plan_chunks(lengths, budget)]


def padded_tokens(chunks: list[list[int]], widths: list[int], real: int) -> int:
    """Padding positions the forwards of ``chunks`` compute (rows x width, summed) beyond ``real`` tokens."""
    return sum(len(c) * w for c, w in zip(chunks, widths)) - real


def put_back(parts: list[tuple[list[int], torch.Tensor]], B: int, T: int) -> torch.Tensor:
    """The chunks' ``[rows, width]`` log-probs in the batch's ``[B, T]`` order (zeros past each chunk's width)."""
    first = parts[0][1]
    out_BT = torch.zeros(B, T, dtype=first.dtype, device=first.device)
    for rows, logp in parts:
        out_BT[torch.tensor(rows, device=first.device), : logp.size(1)] = logp
    return out_BT


def forward_rows(budget: int, width: int) -> int:
    """Rows of a ``width``-wide log-prob forward that keep it within the token budget (at least one)."""
    return max(1, budget // max(width, 1))


def check_world(budget: int | None, world: int) -> None:
    """A token budget on one process only: every rank must run as many forwards/backwards as the others (DDP's
    gradient all-reduce and FSDP2's gathers are collective), and each rank's lengths give it its own count."""
    if budget and world > 1:
        raise ValueError(f"train.micro_batch_tokens ({budget}) on {world} ranks: each rank's rows would give it its "
                         "own number of chunks (collective forwards/backwards); allowed on several ranks: "
                         "train.micro_batch_size, micro_batch_tokens null")
