"""The models and twin studies of the acceptance run: architectures written here, weights random.

Dimensions are the published configs' (Qwen2.5-1.5B = DeepSeek-R1-Distill-Qwen-1.5B, the peft_zoo base;
Qwen3-1.7B-Base, the reward_density student; Qwen2.5-7B for ``--large``). Nothing is downloaded: the
tokenizer is a byte-level BPE trained here on the synthetic task (lorarl.models.build_tokenizer) and the
model keeps its real vocabulary size (ids past the tokenizer's decode to nothing). A random model at a
150k vocabulary almost never samples EOS, so completions run to the full budget (the report gives the fill).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lorarl.sampler_logprobs import sampler_logprobs_mismatch


@dataclass(frozen=True)
class Arch:
    family: str  # "qwen2" | "qwen3": the transformers model class
    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (grouped-query attention)
    intermediate: int  # MLP width
    vocab: int  # vocab_size (the embedding and LM head shapes)
    tie: bool  # tie_word_embeddings
    head_dim: int | None = None  # qwen3: explicit head_dim


ARCHS: dict[str, Arch] = {
    "qwen2.5-1.5b": Arch("qwen2", 1536, 28, 12, 2, 8960, 151936, False),
    "qwen3-1.7b": Arch("qwen3", 2048, 28, 16, 8, 6144, 151936, True, head_dim=128),
    "qwen2.5-7b": Arch("qwen2", 3584, 28, 28, 4, 18944, 152064, False),
    # --cpu-smoke: the same families at a size this 2-core box trains in seconds (head_dim 32: vLLM's CPU
    # attention refuses 16, and --cpu-smoke runs its vLLM checks where vLLM's CPU build is installed)
    "tiny-qwen2": Arch("qwen2", 64, 2, 2, 1, 128, 4096, False),
    "tiny-qwen3": Arch("qwen3", 64, 2, 4, 2, 128, 4096, True, head_dim=32),
}


@dataclass(frozen=True)
class Twin:
    """One study's twin: its real shape, and the budget this run gives it."""

    study: str  # the published study it mirrors
    arch: str  # key of ARCHS
    cell: dict[str, Any]  # the study's per-cell settings that fix the shape (adapter, batch, lengths, loss)
    completion: int  # completion budget this run uses (the study's: cell["train"]["max_completion_length"])


def twins(mode: str) -> list[Twin]:
    """The twins of reward_density and peft_zoo (mode: full, quick, large, cpu-smoke)."""
    rd = {"adapter": {"method": "lora", "rank": 1, "alpha": 32},
          "train": {"lr": 3.0e-5, "prompts_per_step": 4, "generations": 4, "max_completion_length": 1536,
                    "temperature": 0.7, "top_p": 0.95, "beta": 0.05, "kl_estimator": "one_sided",
                    "kl_importance_correction": False, "kl_monitor_every": 10, "loss_type": "dapo", "epsilon": 0.2}}
    pz = {"adapter": {"method": "lora", "rank": 32, "alpha": 64, "dropout": 0.05, "init": "kaiming"},
          "train": {"lr": 1.0e-5, "prompts_per_step": 16, "generations": 8, "max_prompt_length": 512,
                    "prompt_overflow": "truncate_left", "max_completion_length": 16384, "temperature": 1.0, "loss_type": "dapo", "epsilon": 0.2,
                    "epsilon_high": 0.28, "beta": 0.0}}
    if mode == "cpu-smoke":
        small = {"prompts_per_step": 2, "generations": 2}
        return [Twin("reward_density", "tiny-qwen3", _with(rd, small), 12),
                Twin("peft_zoo", "tiny-qwen2", _with(pz, small), 12)]
    budget = {"quick": (512, 256), "full": (1536, 1024), "large": (1536, 1024)}[mode]  # 10 min on one GPU (estimate)
    out = [Twin("reward_density", "qwen3-1.7b", rd, budget[0]), Twin("peft_zoo", "qwen2.5-1.5b", pz, budget[1])]
    if mode == "large":
        out.append(Twin("peft_zoo_7b", "qwen2.5-7b", _with(pz, {"prompts_per_step": 4}), 1024))
    return out


def _with(cell: dict, train: dict) -> dict:
    return {**cell, "train": {**cell["train"], **train}}


def twin_study(twin: Twin, model_dir: str, steps: int, seeds: int, eval_limit: int, engine: str = "hf",
               completion: int | None = None, eager: bool = False) -> dict:
    """The twin as a study document: the twin's shape on the synthetic task, one cell per seed
    (``completion``: another budget than the twin's, e.g. the pack check's shorter one; ``eager``: vLLM
    rollouts without compiled graphs, as on vLLM's CPU build)."""
    completion = completion or twin.completion
    train = {**twin.cell["train"], "steps": steps, "max_completion_length": completion,
             "precision": "bf16-mixed", "checkpoint_every": 0}
    backend = "vllm" if engine == "vllm" else "hf"
    if engine == "vllm" and sampler_logprobs_mismatch("processed", train.get("temperature", 1.0), train.get("top_p", 1.0)):
        train["top_p"] = 1.0  # vLLM's processed logprobs are renormalised over a nucleus: the vLLM twin samples all of it
    return {"name": f"gpucheck_{twin.study}" + ("_vllm" if engine == "vllm" else ""),
            "defaults": {
                "model": model_dir,
                "task": {"name": "synthetic", "seed": 1234, "n_train": 200, "n_eval": max(eval_limit, 4)},
                "adapter": twin.cell["adapter"], "train": train,
                "rollout": {"engine": engine, **({"enforce_eager": True} if engine == "vllm" and eager else {})},
                "eval": {"max_new_tokens": completion, "backend": backend,
                         "benchmarks": {"synthetic": {"limit": eval_limit}}}},
            "axes": {"seed": {"field": "seed", "prefix": "s", "values": list(range(seeds))}}}


def build_model(arch_name: str, out_dir: Path, device: str) -> dict[str, Any]:
    """A randomly initialised model of ``arch_name`` + the local tokenizer, saved in bf16 (cached by name)."""
    import json
    import time

    import torch

    from lorarl.models import build_tokenizer

    a = ARCHS[arch_name]
    stamp = out_dir / "gpucheck_model.json"
    if stamp.exists():
        return json.loads(stamp.read_text())
    t0 = time.perf_counter()
    tok = build_tokenizer([f"Q: {x}+{y}=?\nA: {x}+{y}={x + y}\n\\boxed{{{x + y}}}" for x in range(30) for y in range(30)]
                          + ["0123456789+-*=?()\nQA: \\boxed{}"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    kw = dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate, max_position_embeddings=32768,
              tie_word_embeddings=a.tie, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
              bos_token_id=tok.eos_token_id, rope_theta=1.0e6)
    if a.family == "qwen3":
        from transformers import Qwen3Config as Config, Qwen3ForCausalLM as Model

        kw["head_dim"] = a.head_dim
    else:
        from transformers import Qwen2Config as Config, Qwen2ForCausalLM as Model
    torch.manual_seed(0)
    with torch.device(device):
        model = Model(Config(**kw)).to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    info = {"arch": arch_name, **asdict(a), "params": sum(p.numel() for p in model.parameters()),
            "tokenizer_vocab": len(tok), "build_s": round(time.perf_counter() - t0, 2)}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    stamp.write_text(json.dumps(info, indent=2) + "\n")
    return info
