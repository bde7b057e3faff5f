"""Saved LoRA adapters of the tiny model and the fake engine's settings."""

from __future__ import annotations

import torch

from tests.support.grpo import load


def save_adapter(tiny_dir, path, seed, r=4, alpha=None):
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    m, _ = load(tiny_dir)
    pm = get_peft_model(m, LoraConfig(r=r, lora_alpha=alpha or 2 * r, target_modules="all-linear", task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in sorted(pm.named_modules(), key=lambda x: x[0]):
            if isinstance(layer, LoraLayer):
                w = layer.lora_B["default"].weight
                w.copy_(torch.randn(w.shape, generator=g) * 2.0)
    pm.save_pretrained(path)
    return str(path)


def settings(tok):
    from lorarl.pack.generate import SampleSettings

    return SampleSettings(prompt_width=16, max_new_tokens=6, temperature=1.0, top_p=1.0,
                          pad_token_id=tok.pad_token_id, eos_token_ids=(tok.eos_token_id,))
