"""Tiny models of each prompt format."""

from __future__ import annotations

import torch


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def save_prompt_tinies(tmp_path_factory):
    """A tiny model saved twice: plain tokenizer, and the same tokenizer with a chat template."""
    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "What is 3 + 3? Please reason step by step"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    out = {}
    for name, tpl in (("plain", None), ("chat", CHAT)):
        d = tmp_path_factory.mktemp(name)
        tok.chat_template = tpl
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = str(d)
    return out
