"""The ids a training rollout stops at: every EOS id of the model's generation config, and the
tokenizer's EOS (put first when the generation config lacks it).

Gemma-3-1B-it's tokenizer names ``<eos>`` (1) only; its generation config lists ``[1, 106]``, 106 being
``<end_of_turn>``, the id the instruction-tuned model actually ends a reply with. This is the rule TRL's
``GRPOTrainer.__init__`` applies to solo training (its ``eos_token_ids``; tests/test_stop_tokens.py holds
the two equal), and the pack (:mod:`lorarl.pack.build`) samples with the same ids, so a packed cell ends
its completions where the same cell trained solo ends them.
"""

from __future__ import annotations

from typing import Any


def stop_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """``model.generation_config.eos_token_id`` (an id, a list or None) merged with ``tokenizer.eos_token_id``."""
    cfg = getattr(model, "generation_config", None)
    ids = getattr(cfg, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else [int(i) for i in ids]
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None and tok_eos not in ids:
        ids = [int(tok_eos), *ids]
    return tuple(dict.fromkeys(int(i) for i in ids))
