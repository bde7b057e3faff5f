"""A tiny model whose generation config has two EOS ids."""

from __future__ import annotations

import torch


def save_two_eos(tmp_path_factory):
    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    d = tmp_path_factory.mktemp("two_eos")
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    turn = tok.convert_tokens_to_ids("?")  # stands in for <end_of_turn>: a second stop id, not the tokenizer's EOS
    assert turn not in (tok.eos_token_id, tok.unk_token_id, tok.pad_token_id)
    model.generation_config.eos_token_id = [tok.eos_token_id, turn]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d), turn
