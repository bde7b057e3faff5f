"""vLLM checks of the acceptance run, each in its own process (vLLM does not free an engine on ``del``):
``python -m lorarl.gpucheck.vllmjob push MODEL_DIR RANK ALPHA``. Prints one JSON line.

push: one engine; a policy of the twin's shape (base in bf16 + a LoRA whose B is non-zero, as after
training) merged and pushed through the path TRL's colocated sync uses
(``llm_engine.model_executor.driver_worker.model_runner.model.load_weights``) with lorarl's exact
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
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lorarl.train.rollout import effective_named_params

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(model_dir)
    llm = api.LLM(model=model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=512, seed=0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    policy = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear",
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(0)
    for name, p in policy.named_parameters():  # a trained LoRA: B moved off zero (|dW| ~ alpha/r * |B||A|)
        if "lora_B" in name:
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    target = llm.llm_engine.model_executor.driver_worker.model_runner.model
    times = []
    for _ in range(pushes):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            target.load_weights(list(effective_named_params(policy)))
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


def main() -> None:
    kind, model_dir, rank, alpha = sys.argv[1:5]
    if kind != "push":
        raise SystemExit(f"vllmjob: kind {kind!r}; allowed: push")
    from types import SimpleNamespace

    import vllm  # noqa: PLC0415 - GPU-only dependency

    api = SimpleNamespace(LLM=vllm.LLM, SamplingParams=vllm.SamplingParams)
    print(json.dumps(push_check(api, model_dir, int(rank), int(alpha))))


if __name__ == "__main__":
    main()
