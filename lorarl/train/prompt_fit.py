"""Training prompts over ``train.max_prompt_length`` tokens: dropped from the dataset
(``train.prompt_overflow: drop``, lorarl.tasks.prompt.within_length) or cut to their last N tokens
(``truncate_left``, verl's ``truncation: left`` that papers 002/003/004 train with). The cut acts on
the token ids TRL makes of a prompt (chat template applied), so the HF and the vLLM engine, the
old/reference log-probs and the reward regime all see the same truncated prompt."""

from __future__ import annotations

from typing import Any, Sequence


def keep_last(ids: Sequence[int], keep: int | None) -> list[int]:
    """The last ``keep`` ids of a prompt (all of them when ``keep`` is None or the prompt fits)."""
    ids = list(ids)
    return ids[-keep:] if keep is not None and len(ids) > keep else ids


class LeftTruncation:
    """Mix-in of the GRPO trainer: TRL's tokenised prompts cut to their last ``prompt_keep`` tokens."""

    prompt_keep: int | None = None  # a LorarlGRPOTrainer constructor argument (None: untouched)

    def _tokenize_prompts(self, prompts: list):
        prompt_ids, images, fields = super()._tokenize_prompts(prompts)
        if self.prompt_keep is None:
            return prompt_ids, images, fields
        return [keep_last(p, self.prompt_keep) for p in prompt_ids], images, fields


def fixed_widths(out: dict, width: int, T: int, pad: int) -> dict:
    """TRL's scored batch with its prompts left-padded to ``width`` columns and its completion-aligned ``[B, T_b]``
    tensors right-padded to ``T`` (the pack's widths: lorarl.pack.steps), so every forward of the update sees the
    shapes and positions a pack of one sees."""
    import torch
    import torch.nn.functional as F

    P_b, T_b = out["prompt_ids"].size(1), out["completion_ids"].size(1)
    if P_b > width or T_b > T:
        raise ValueError(f"a batch of {P_b} prompt / {T_b} completion columns is wider than the cell's {width} / {T}")
    res = dict(out)
    for key, value in (("prompt_ids", pad), ("prompt_mask", 0)):
        res[key] = F.pad(out[key], (width - P_b, 0), value=value)
    B = out["completion_ids"].size(0)
    for key, v in out.items():
        if key not in ("prompt_ids", "prompt_mask") and torch.is_tensor(v) and v.dim() == 2 and v.shape == (B, T_b):
            res[key] = F.pad(v, (0, T - T_b), value=pad if key == "completion_ids" else 0)
    return res


def prompt_width(cfg: Any, tokenizer: Any, prompts: list) -> int:
    """The prompt columns of every rollout and update batch of a cell: its longest training prompt in tokens (after
    ``train.prompt_overflow: truncate_left``), the same in a solo job and in any pack (lorarl.pack.build), so a row's
    arithmetic never depends on the other rows of its batch (docs/packed.md, "One cell, one result")."""
    from lorarl.tasks.prompt import prompt_ids, prompt_keep

    return max(len(keep_last(prompt_ids(tokenizer, p, cfg.prompt), prompt_keep(cfg.train))) for p in prompts)
