"""vLLM checks of the acceptance run, each in its own process (vLLM does not free an engine on ``del``):
``python -m lorarl.gpucheck.vllmjob push|multilora MODEL_DIR RANK ALPHA``. Prints one JSON line.

push: one engine; a policy of the twin's shape (base in bf16 + a LoRA whose B is non-zero, as after
training) merged and pushed as the trainer pushes (:func:`lorarl.vllm_push.push_weights`: the model runner's
``reload_weights``, on a GPU and on vLLM's CPU build alike) with lorarl's exact
merge (:func:`lorarl.train.rollout.effective_named_params`), timed; then the engine samples and the
policy scores the same tokens: the mean |logp_engine - logp_policy| is the freshness gap of the trained
LoRA (a push that did not land shows the LoRA's whole effect).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

PROMPTS = ["Q: 12+34=?\nA:", "Q: 7+8+9=?\nA:", "Q: 40-15=?\nA:", "Q: 3+3=?\nA:"]


def push_check(api: Any, model_dir: str, rank: int, alpha: int, pushes: int = 3, tokens: int = 16) -> dict:
    import torch
    from transformers import AutoTokenizer

    from lorarl.evaluate.vllm_backend import inprocess_engine_kwargs
    from lorarl.train.rollout import effective_named_params
    from lorarl.vllm_push import push_weights

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(model_dir)
    llm = api.LLM(model=model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=512, seed=0,
                  enforce_eager=bool(getattr(api, "cpu", False)),  # CPU build: no inductor compile (as VLLMBackend)
                  **inprocess_engine_kwargs())  # load_weights needs the engine core in this process
    policy = _trained_lora(model_dir, rank, alpha, device)
    _draw_b(policy, 0, 0.02)  # a trained LoRA: B moved off zero (|dW| ~ alpha/r * |B||A|)
    times = []
    for _ in range(pushes):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            push_weights(llm, effective_named_params(policy))  # the trainer's push (lorarl.vllm_push)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    params = api.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=tokens, logprobs=0, seed=0)
    outs = llm.generate([{"prompt_token_ids": tok(p)["input_ids"]} for p in PROMPTS], params, use_tqdm=False)
    diffs = []
    policy.eval()
    for prompt, out in zip(PROMPTS, outs):
        comp = out.outputs[0]
        ids = tok(prompt)["input_ids"] + list(comp.token_ids)
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = policy(input_ids=torch.tensor([ids], device=device)).logits.float()
        logp = torch.log_softmax(logits[0, len(ids) - len(comp.token_ids) - 1:-1], dim=-1)
        for j, t in enumerate(comp.token_ids):
            diffs.append(abs(comp.logprobs[j][t].logprob - logp[j, t].item()))
    n_params = sum(p.numel() for _, p in effective_named_params(policy))
    return {"push_s": statistics.median(times), "pushes": pushes, "pushed_params": n_params,
            "gap": sum(diffs) / len(diffs), "tokens": len(diffs)}


def _trained_lora(model_dir: str, rank: int, alpha: int, device: str) -> Any:
    """Base in bf16 + a LoRA of the twin's rank (B drawn again by :func:`_draw_b` per member)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    return get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear",
                                           lora_dropout=0.0, task_type="CAUSAL_LM"))


def _draw_b(policy: Any, seed: int, scale: float) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(policy.named_parameters()):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def multilora_check(api: Any, model_dir: str, rank: int, alpha: int, work: str, members: int = 4,
                    groups: int = 2, generations: int = 4, tokens: int = 32) -> dict:
    """The pack's vLLM sampling path (lorarl.pack.multilora): ``members`` adapters saved, one engine with
    LoRA enabled, one ``generate`` call routing each member's prompts to its adapter, the same seed streams."""
    import torch
    from transformers import AutoTokenizer

    from lorarl.pack.generate import SampleSettings
    from lorarl.pack.multilora import build_requests, generate_multilora, saved_engine_lora_kwargs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = _trained_lora(model_dir, rank, alpha, device)
    dirs = []
    for k in range(members):
        _draw_b(policy, k + 1, 0.05)
        dirs.append(f"{work}/adapter-{k}")
        policy.save_pretrained(dirs[-1])
    del policy
    llm = api.LLM(model=model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=512, seed=0,
                  enforce_eager=bool(getattr(api, "cpu", False)), **saved_engine_lora_kwargs([f"m{k}" for k in range(members)], dirs))
    loras = [api.LoRARequest(lora_name=f"m{k}", lora_int_id=k + 1, lora_path=d) for k, d in enumerate(dirs)]
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:groups]]
    s = SampleSettings(prompt_width=max(map(len, prompts)), max_new_tokens=tokens, temperature=1.0, top_p=1.0,
                       pad_token_id=tok.pad_token_id, eos_token_ids=(tok.eos_token_id,))
    req = build_requests(api, loras, [prompts] * members, [torch.Generator().manual_seed(5) for _ in range(members)],
                         s, generations)
    t0 = time.perf_counter()
    out = generate_multilora(llm, req, members)
    wall = time.perf_counter() - t0
    rows = [len(o.completion_ids) if o else 0 for o in out]
    n_tokens = sum(len(c) for o in out if o for c in o.completion_ids)
    samples = [o.completion_ids if o else None for o in out]
    distinct = len({json.dumps(x) for x in samples})
    return {"members": members, "rows_per_member": rows, "expected_rows": groups * generations,
            "distinct_members": distinct, "tokens": n_tokens, "tokens_per_s": n_tokens / wall if wall else 0.0,
            "wall_s": wall}


def main() -> None:
    kind, model_dir, rank, alpha = sys.argv[1:5]
    if kind not in ("push", "multilora"):
        raise SystemExit(f"vllmjob: kind {kind!r}; allowed: push, multilora")
    from lorarl.evaluate.vllm_backend import _vllm_api

    api = _vllm_api()  # vllm's LLM, SamplingParams, LoRARequest, and whether this is its CPU build
    if kind == "push":
        print(json.dumps(push_check(api, model_dir, int(rank), int(alpha))))
    else:
        print(json.dumps(multilora_check(api, model_dir, int(rank), int(alpha), sys.argv[5])))


if __name__ == "__main__":
    main()
