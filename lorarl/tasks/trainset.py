"""A task's training set as TRL's dataset, the cell's prompt rendered as evaluation renders it
(lorarl.tasks.prompt): what the solo job's door (lorarl.train.prepare) and the pack's door
(lorarl.pack.build) train on."""

from __future__ import annotations

from typing import Any


def training_dataset(cfg: Any, tokenizer: Any) -> tuple[Any, dict]:
    """The train split as TRL's dataset: ``prompt`` = the cell's prompt (the one evaluation uses),
    ``answer`` = the gold; prompts over ``train.max_prompt_length`` tokens are dropped (or,
    ``train.prompt_overflow: truncate_left``, cut in the trainer and counted here). Returns (dataset,
    facts for the summary)."""
    import datasets

    from lorarl.tasks import task_records
    from lorarl.tasks.prompt import prompt_ids, prompt_keep, training_prompts, uses_chat_template, within_length

    rows, _ = task_records(cfg.task)
    prompts = training_prompts(cfg, [r["prompt"] for r in rows], tokenizer)
    fits = within_length(cfg, prompts, tokenizer)
    data = [{"prompt": p, "answer": r["answer"]} for p, r, k in zip(prompts, rows, fits) if k]
    if not data:
        raise ValueError(f"train.max_prompt_length={cfg.train.max_prompt_length}: every training prompt is longer")
    keep = prompt_keep(cfg.train)
    facts = {"prompts_dropped_too_long": len(rows) - len(data),
             **({"prompts_truncated_left": sum(len(prompt_ids(tokenizer, d["prompt"], cfg.prompt)) > keep for d in data)}
                if keep is not None else {}),
             "prompt_chat_template": uses_chat_template(cfg.prompt.chat_template, tokenizer)}
    return datasets.Dataset.from_list(data), facts
