"""A LorarlGRPOTrainer of the tiny model with given train settings and fixed scores."""

from __future__ import annotations

import datasets

from lorarl.language.config import CellConfig


G = 2


def cfg_with(**train) -> CellConfig:
    base = {"steps": 2, "prompts_per_step": 2, "generations": G, "max_completion_length": 6, "kl_monitor_every": 0}
    return CellConfig.model_validate({"train": {**base, **train}})


def build(tiny_dir, tmp_path, cfg, scores=(1.0, 0.0, 0.0, 1.0)):
    from lorarl.models import load_model_and_tokenizer
    from lorarl.train.prepare import reward_of
    from lorarl.train.trl_args import build_trainer, grpo_args

    model, tok = load_model_and_tokenizer(tiny_dir)
    ds = datasets.Dataset.from_list([{"prompt": f"Q: {i}+{i}=?\nA: ", "answer": str(2 * i)} for i in range(8)])
    regime, grading = reward_of(cfg, tok, tmp_path, "cpu")
    trainer = build_trainer(cfg, model=model, tokenizer=tok, args=grpo_args(cfg, tmp_path / "o", use_cpu=True),
                            train_dataset=ds, ref_model=None, regime=regime, grading=grading)
    from lorarl.rewards.outcome import OutcomeDeposits

    trainer.regime = OutcomeDeposits(score_fn=lambda c, a: list(scores)[: len(c)])
    return trainer, ds
