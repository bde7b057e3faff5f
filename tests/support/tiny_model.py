"""The tiny model and tokenizer many tests train (the `tiny_dir` fixture, tests/conftest.py), built and saved here."""

from __future__ import annotations

import torch


def save_tiny(d, hidden: int = 32, intermediate: int = 64) -> str:
    """The tiny model and tokenizer of these tests, saved in ``d`` (hidden 64: head_dim 32, which vLLM's CPU
    attention takes; it refuses 16)."""
    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=hidden, layers=2, heads=2, kv_heads=1, intermediate=intermediate), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def used_static(model) -> bool:
    """transformers' generate built a StaticCache on ``model`` (it records the cache length there)."""
    from lorarl.decoding import base_model

    return getattr(base_model(model), "_previous_max_cache_length", None) is not None
