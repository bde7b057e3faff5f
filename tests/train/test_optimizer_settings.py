"""train.adam_beta2 and train.max_grad_norm (the GSM8K GRPO recipe's 0.99 and 0.1, paper 000's study) reach every
optimiser a cell can train with: TRL's (GRPOConfig), a method's own (LoRA+, LoRA-FA, masked full fine-tuning) and
the pack engine's AdamW and per-cell clipping; at their defaults they stay out of the cell's signature."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch

from lorarl.language.config import CellConfig
from lorarl.language.signature import signature_dump

warnings.filterwarnings("ignore", message=".*")


def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=97, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                                        tie_word_embeddings=True)).eval()


def recipe_cfg(**adapter) -> CellConfig:
    return CellConfig(adapter={"method": "lora", "rank": 4, **adapter},
                      train={"steps": 2, "prompts_per_step": 2, "generations": 2, "max_completion_length": 6,
                             "kl_monitor_every": 0, "adam_beta2": 0.99, "max_grad_norm": 0.1})


def test_defaults_are_transformers_and_stay_out_of_the_signature():
    t = CellConfig().train
    assert (t.adam_beta2, t.max_grad_norm) == (0.999, 1.0)
    assert not {"adam_beta2", "max_grad_norm"} & set(signature_dump(CellConfig())["train"])
    assert signature_dump(recipe_cfg())["train"]["adam_beta2"] == 0.99
    with pytest.raises(ValueError, match="adam_beta2"):
        CellConfig(train={"adam_beta2": 1.0})


def test_trl_receives_both(tmp_path):
    from lorarl.train.trl_args import grpo_args

    a = grpo_args(recipe_cfg(), tmp_path, use_cpu=True)
    assert (a.adam_beta1, a.adam_beta2, a.max_grad_norm) == (0.9, 0.99, 0.1)
    off = recipe_cfg().model_copy(update={"train": recipe_cfg().train.model_copy(update={"max_grad_norm": None})})
    assert grpo_args(off, tmp_path, use_cpu=True).max_grad_norm == 0.0   # HF's Trainer: 0 = no clipping


@pytest.mark.parametrize("adapter", [{"method": "lora_plus"}, {"method": "lora_fa"},
                                     {"method": "full", "rank": None, "mask": "low_magnitude"}],
                         ids=lambda a: a["method"])
def test_a_methods_own_optimiser_takes_beta2(adapter):
    from lorarl.adapters import build_adapter

    policy = build_adapter(copy.deepcopy(tiny_model()), recipe_cfg(**adapter))
    assert policy.optimizer is not None
    assert {tuple(g["betas"]) for g in policy.optimizer.param_groups} == {(0.9, 0.99)}


def test_the_pack_engine_takes_both(tmp_path):
    from lorarl.pack.build import build_pack
    from tests.support.tiny_model import save_tiny

    tiny = save_tiny(tmp_path / "tiny")
    cfg = recipe_cfg(alpha=8, dropout=0.0).model_copy(update={
        "model": str(tiny), "task": CellConfig(task={"name": "synthetic", "n_train": 8, "n_eval": 2}).task})
    pack = build_pack([SimpleNamespace(id="a", config=cfg)], results_dir=tmp_path)
    (cell,) = pack.loop.trainer.cells
    assert cell.max_grad_norm == 0.1
    assert {tuple(g["betas"]) for g in cell.optimizer.param_groups} == {(0.9, 0.99)}
