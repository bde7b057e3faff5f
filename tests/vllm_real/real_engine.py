"""One real vLLM CPU engine per test process, shared by the real-engine tests (each engine reserves its share of host
memory for a KV cache, and on a GPU a second engine in a process fails vLLM's startup memory check), and the tiny
local models it serves.

The models: a Qwen2 of head_dim 32 (vLLM's CPU attention refuses head_dim 16) on the character tokenizer of
tests/evaluate/test_eval_backends.py, two LoRA snapshots (ranks 8 and 12, B moved off zero) and a DoRA adapter (merged
before serving). The engine: float32, eager, the in-process executor (TRL's colocate mode; starts in seconds and
lets weights be pushed), LoRA enabled (rank up to 16, two adapters resident), 15% of host memory for its KV cache.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ENGINE_KWARGS = dict(dtype="float32", enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.15, seed=0,
                     enable_lora=True, max_lora_rank=16, max_loras=2, logprobs_mode="processed_logprobs")
_SHARED: dict[str, Any] = {}


def build_models(root: Path) -> dict[str, Path]:
    """base, lora (r 8), lora2 (r 12), dora (r 4) under ``root``; deterministic."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.support.eval_backends import _tokenizer

    tok = _tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=128, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
                      tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    paths = {"base": root / "base"}
    for name, seed, extra in (("lora", 1, {"r": 8}), ("lora2", 2, {"r": 12}), ("dora", 3, {"r": 4, "use_dora": True})):
        torch.manual_seed(seed)
        model = get_peft_model(Qwen2ForCausalLM.from_pretrained(root / "base"),
                               LoraConfig(lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"],
                                          init_lora_weights=False, **extra))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.mul_(4.0)  # a trained adapter: its effect shows in greedy answers
        model.save_pretrained(root / name)
        paths[name] = root / name
    return paths


def real_api() -> SimpleNamespace:
    from lorarl.evaluate.vllm_backend import _vllm_api

    return _vllm_api()


def shared() -> SimpleNamespace:
    """The process's engine and models (built on first use): ``llm``, ``api``, ``paths``, ``tokenizer``, ``root``."""
    if not _SHARED:
        from lorarl.evaluate.vllm_backend import inprocess_engine_kwargs

        root = Path(tempfile.mkdtemp(prefix="vllm_real_"))
        paths = build_models(root)
        api = real_api()
        llm = api.LLM(model=str(paths["base"]), **ENGINE_KWARGS, **inprocess_engine_kwargs())
        _SHARED.update(llm=llm, api=api, paths=paths, tokenizer=llm.get_tokenizer(), root=root)
    return SimpleNamespace(**_SHARED)


def restore_base(s: SimpleNamespace) -> None:
    """Push the base weights back (a test that pushed other weights leaves the shared engine as it found it)."""
    from lorarl.evaluate.vllm_backend import model_weights
    from lorarl.vllm_push import push_weights

    push_weights(s.llm, model_weights(s.paths["base"]))
