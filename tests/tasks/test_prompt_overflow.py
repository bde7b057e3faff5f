"""``train.prompt_overflow``: a training prompt over ``train.max_prompt_length`` tokens is dropped
(``drop``, the default and the old behaviour) or keeps its last tokens (``truncate_left``, verl's and
old TRL's left truncation that papers 002/003/004 train with); the cut acts on TRL's token ids."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lorarl.language.config import CellConfig
from lorarl.language.signature import signature_dump, train_signature
from tests.support.grpo_knobs import G, build


def _cfg(**train):
    base = {"steps": 1, "prompts_per_step": 2, "generations": G, "max_completion_length": 6, "kl_monitor_every": 0}
    return CellConfig.model_validate({"train": {**base, **train}})


def test_setting_is_checked_and_hashed_only_when_set():
    with pytest.raises(ValidationError, match="train.prompt_overflow truncate_left needs train.max_prompt_length"):
        _cfg(prompt_overflow="truncate_left")
    with pytest.raises(ValidationError, match="prompt_overflow"):
        _cfg(max_prompt_length=4, prompt_overflow="cut")
    drop, cut = _cfg(max_prompt_length=4), _cfg(max_prompt_length=4, prompt_overflow="truncate_left")
    assert "prompt_overflow" not in signature_dump(drop)["train"]  # the default: every old hash stays
    assert train_signature(drop) == train_signature(_cfg(max_prompt_length=4, prompt_overflow="drop"))
    assert train_signature(cut) != train_signature(drop)


def test_training_dataset_drops_or_keeps(tiny_dir):
    from lorarl.models import load_model_and_tokenizer
    from lorarl.tasks.prompt import prompt_ids
    from lorarl.tasks.trainset import training_dataset

    _, tok = load_model_and_tokenizer(tiny_dir)
    task = {"name": "synthetic", "seed": 1, "n_train": 40, "n_eval": 4, "max_operands": 3}
    lengths = [len(prompt_ids(tok, p)) for p in training_dataset(CellConfig.model_validate({"task": task}), tok)[0]["prompt"]]
    limit = sorted(lengths)[len(lengths) // 2]
    over = sum(n > limit for n in lengths)
    assert 0 < over < len(lengths)
    cfg = lambda mode: CellConfig.model_validate(  # noqa: E731
        {"task": task, "train": {"max_prompt_length": limit, "prompt_overflow": mode}})
    ds, facts = training_dataset(cfg("drop"), tok)
    assert len(ds) == len(lengths) - over and facts["prompts_dropped_too_long"] == over
    ds, facts = training_dataset(cfg("truncate_left"), tok)
    assert len(ds) == len(lengths) and facts["prompts_dropped_too_long"] == 0
    assert facts["prompts_truncated_left"] == over


def test_rollouts_see_the_last_tokens(tiny_dir, tmp_path):
    """The trainer's prompt ids are the last max_prompt_length ids of TRL's tokenisation."""
    from lorarl.tasks.prompt import prompt_ids

    trainer, ds = build(tiny_dir, tmp_path, _cfg(max_prompt_length=4, prompt_overflow="truncate_left"))
    assert trainer.prompt_keep == 4
    trainer.model.train()
    rows = [dict(ds[i]) for i in range(2) for _ in range(G)]
    out = trainer._generate_and_score_completions(rows)
    ids, mask = out["prompt_ids"], out["prompt_mask"]
    for row, got, m in zip(rows, ids, mask):
        full = prompt_ids(trainer.processing_class, row["prompt"])
        assert len(full) > 4 and got[m.bool()].tolist() == full[-4:]
    plain, _ = build(tiny_dir, tmp_path / "plain", _cfg(max_prompt_length=4))
    assert plain.prompt_keep is None  # drop: the dataset filtered; rollouts untouched
