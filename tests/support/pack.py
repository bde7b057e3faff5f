"""Packed loss and gradients: adapters, synthetic batches and planned cells."""

from __future__ import annotations

import torch

from tests.support.grpo import G, MAXLEN, P


def peft_config(kind):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
                      use_dora=kind == "dora")


def init_adapter(model, kind, seed):
    """Non-zero B (so the policy differs from the base); for 'dct' A is the orthonormal DCT-II rows."""
    from peft.tuners.lora import LoraLayer

    from lorarl.adapters.inits import dct_rows

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in sorted(model.named_modules(), key=lambda x: x[0]):
            if isinstance(m, LoraLayer) and "default" in m.lora_A:
                A = m.lora_A["default"].weight
                if kind == "dct":
                    A.copy_(dct_rows(A.size(0), A.size(1)))
                B = m.lora_B["default"].weight
                B.copy_(torch.randn(B.shape, generator=g) * 0.3)


def synthetic_batch(seed, step, ref_model, tok, vocab):
    """A scored batch as the solo trainer hands it to the loss: ids, masks, [B, T] advantages, ref logps."""
    g = torch.Generator().manual_seed(1000 * seed + step)
    B, Pw, T = P * G, 4 + seed % 3, MAXLEN
    prompt_ids = torch.randint(5, vocab, (B, Pw), generator=g)
    prompt_mask = torch.ones(B, Pw, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_ids[0, :2] = tok.pad_token_id
    completion_ids = torch.randint(5, vocab, (B, T), generator=g)
    completion_mask = (torch.arange(T).unsqueeze(0) < torch.randint(2, T + 1, (B, 1), generator=g)).long()
    adv = torch.randn(B, T, generator=g) * completion_mask
    b = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
         "completion_mask": completion_mask, "advantages": adv}
    ids = torch.cat([prompt_ids, completion_ids], 1)
    with torch.no_grad():
        logits = ref_model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
        b["lorarl_ref_logps"] = torch.log_softmax(logits[:, -T - 1:-1].float(), -1).gather(
            -1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return b


def _cell(cid, **over):
    from types import SimpleNamespace

    from lorarl.language.config import CellConfig

    raw = {"adapter": {"method": "lora", "rank": 8, "alpha": 16, "dropout": 0.0}}
    for k, v in over.items():
        sec, _, field = k.partition("__")
        raw.setdefault(sec, {})[field] = v
    return SimpleNamespace(id=cid, config=CellConfig(**raw))
