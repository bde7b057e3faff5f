"""Token lengths of a cell's sequences: the prompt charged to a sequence and the evaluation's longest one.

Read by the memory plan (lorarl.memory.plan, lorarl.memory.evaluation) and by the evaluate stage, whose vLLM engine
starts with ``max_model_len`` :func:`sequence_tokens`: one length, so the plan checks the engine that runs."""

from __future__ import annotations

from typing import Any

PROMPT_SYNTHETIC = 32  # tokens of a synthetic-task prompt (a few operands; no max_prompt_length needed)
PROMPT_ASSUMED = 512  # a dataset task without train.max_prompt_length: prompts assumed this long (noted)


def prompt_tokens(cfg: Any) -> tuple[int, str | None]:
    """Prompt tokens charged to a sequence, and a note when it is an assumption."""
    t = cfg.train
    if t.max_prompt_length:
        return t.max_prompt_length, None
    if cfg.task.name == "synthetic":
        return PROMPT_SYNTHETIC, None
    return PROMPT_ASSUMED, f"no train.max_prompt_length: prompts charged {PROMPT_ASSUMED} tokens"


def longest_budget(cfg: Any) -> tuple[str, int]:
    """(benchmark, max_new_tokens) of the cell's longest evaluation protocol."""
    from lorarl.language.evalplan.plan import benchmark_specs, protocol_for

    budgets = {name: protocol_for(name, spec, cfg.eval).max_new_tokens for name, spec in benchmark_specs(cfg).items()}
    name = max(budgets, key=lambda n: budgets[n])
    return name, budgets[name]


def sequence_tokens(cfg: Any) -> int:
    """Tokens of the evaluation's longest sequence: the prompt charged + the longest max_new_tokens (the memory
    plan's evaluation length, and the vLLM evaluation engine's ``max_model_len``)."""
    return prompt_tokens(cfg)[0] + longest_budget(cfg)[1]
