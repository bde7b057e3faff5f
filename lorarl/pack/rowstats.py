"""The rollout metrics TRL's GRPOTrainer logs for a solo cell, computed for one packed cell's step.

A packed or resident member logs every metric the solo job logs under the same name (tests/train/test_cell_pause.py
compares the column sets): TRL 1.16's ``completions/*`` lengths (``_generate_and_score_completions``: all
completions, then those that ended on an end-of-sequence or pad token, zeros when none did),
``frac_reward_zero_std`` (the share of completions whose group's rewards have zero std), ``rewards/<regime>/*``
(lorarl hands TRL one reward function named after the regime, its value each completion's deposit total) and
``num_tokens`` (the prompt and completion tokens seen so far, as TRL's ``state.num_input_tokens_seen``).
"""

from __future__ import annotations

import torch


def rollout_stats(completion_ids: list[list[int]], eos: set[int], totals: list[float], generations: int,
                  regime: str) -> dict[str, float]:
    """One cell's step: its completions' token ids, the end tokens (eos and pad), each completion's reward."""
    lengths = torch.tensor([len(c) for c in completion_ids], dtype=torch.float32)
    truncated = torch.tensor([not c or c[-1] not in eos for c in completion_ids])
    ended = lengths[~truncated] if bool((~truncated).any()) else torch.zeros(1)
    r = torch.tensor(totals, dtype=torch.float32)
    group_std = r.view(-1, generations).std(dim=1) if generations > 1 else torch.zeros(len(totals))
    std = float(r.std()) if r.numel() > 1 else 0.0
    return {"completions/min_length": float(lengths.min()), "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(truncated.float().mean()),
            "completions/mean_terminated_length": float(ended.mean()),
            "completions/min_terminated_length": float(ended.min()),
            "completions/max_terminated_length": float(ended.max()),
            "frac_reward_zero_std": float(torch.isclose(group_std, torch.zeros_like(group_std)).float().mean()),
            f"rewards/{regime}/mean": float(r.mean()), f"rewards/{regime}/std": std}
