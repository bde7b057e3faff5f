"""Scenarios run the same way against tests/support/fake_vllm.py and vLLM's real CPU engine (the fake's contract tests,
tests/vllm_real/test_fake_contract.py): each takes an engine and its API namespace and returns plain data."""

from __future__ import annotations

from typing import Any, Callable

PROMPT = "Q: 12+7=?\nA: "


def prompt_ids(tokenizer: Any, text: str = PROMPT) -> dict:
    return {"prompt_token_ids": tokenizer(text)["input_ids"]}


def refusal_cases(api: Any, model: str) -> dict[str, Callable[[], Any]]:
    """What vLLM refuses before an engine exists (SamplingParams, LoRARequest, the engine's arguments)."""
    sp, lr = api.SamplingParams, api.LoRARequest
    return {
        "temperature 2.5": lambda: sp(temperature=2.5), "top_p 0": lambda: sp(top_p=0.0),
        "top_k None": lambda: sp(top_k=None), "top_k -2": lambda: sp(top_k=-2), "n 0": lambda: sp(n=0),
        "min_p 1.5": lambda: sp(min_p=1.5), "max_tokens 0": lambda: sp(max_tokens=0),
        "logprobs -2": lambda: sp(logprobs=-2), "max_new_tokens": lambda: sp(max_new_tokens=10),
        "lora_int_id 0": lambda: lr("a", 0, "x"),
        "LLM max_lora_ranks": lambda: api.LLM(model=model, max_lora_ranks=8),
        "LLM max_lora_rank 4": lambda: api.LLM(model=model, enable_lora=True, max_lora_rank=4),
        "LLM logprobs_mode": lambda: api.LLM(model=model, logprobs_mode="final_logprobs"),
        "LLM gpu_memory_utilization 1.5": lambda: api.LLM(model=model, gpu_memory_utilization=1.5),
    }


def family(err: BaseException) -> str:
    """TypeError or ValueError (pydantic's ValidationError is one), else the class name (vLLM 0.31's
    VLLMValidationError is a VLLMClientError, not a ValueError)."""
    return next((c.__name__ for c in (TypeError, ValueError) if isinstance(err, c)), type(err).__name__)


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the family is the outcome compared
        return family(err)
    return "accepted"


def refusals(api: Any, model: str) -> dict[str, str]:
    """Each case's exception family, or 'accepted'."""
    return {name: outcome(call) for name, call in refusal_cases(api, model).items()}


def list_length_refusal(llm: Any, api: Any, tokenizer: Any) -> str:
    return outcome(lambda: llm.generate([prompt_ids(tokenizer)], [api.SamplingParams(max_tokens=2)] * 2,
                                        use_tqdm=False))


def child_seeds(llm: Any, api: Any, tokenizer: Any) -> dict[str, Any]:
    """n > 1 with a seed against its children as separate requests seeded seed + j; one seeded SamplingParams
    shared by two prompts."""
    p = prompt_ids(tokenizer)
    kw = dict(temperature=1.0, top_p=1.0, top_k=0, max_tokens=8)
    fan = llm.generate([p], api.SamplingParams(n=3, seed=100, **kw), use_tqdm=False)[0]
    kids = llm.generate([p] * 3, [api.SamplingParams(n=1, seed=100 + j, **kw) for j in range(3)], use_tqdm=False)
    shared = llm.generate([p, p], api.SamplingParams(n=1, seed=7, **kw), use_tqdm=False)
    return {"fan": [list(o.token_ids) for o in fan.outputs], "kids": [list(r.outputs[0].token_ids) for r in kids],
            "shared": [list(r.outputs[0].token_ids) for r in shared]}


def sampled_logprobs(llm: Any, api: Any, tokenizer: Any, model_dir: str) -> dict[str, Any]:
    """Sampled tokens' returned logprobs at temperature 0.7, top-k 5, top-p 0.9, against the model's raw
    log-softmax and its processed one (temperature, then top-k and top-p, renormalised): the largest gaps."""
    import torch
    from transformers import AutoModelForCausalLM

    p = prompt_ids(tokenizer)
    params = api.SamplingParams(n=3, temperature=0.7, top_k=5, top_p=0.9, max_tokens=6, seed=3, logprobs=0)
    out = llm.generate([p], params, use_tqdm=False)[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    raw_gap = processed_gap = 0.0
    kept = True
    for c in out.outputs:
        ids = p["prompt_token_ids"] + list(c.token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(p["prompt_token_ids"]) - 1:-1].float()
        for j, t in enumerate(c.token_ids):
            got = c.logprobs[j][t].logprob
            raw = torch.log_softmax(logits[j], -1)[t].item()
            x = logits[j] / 0.7
            x = x.masked_fill(x < torch.topk(x, 5).values[-1], float("-inf"))
            srt, idx = x.sort()
            drop = torch.softmax(srt, -1).cumsum(-1) <= 1 - 0.9
            drop[-1] = False
            x[idx[drop]] = float("-inf")
            proc = torch.log_softmax(x, -1)[t].item()
            kept &= proc > float("-inf")
            raw_gap, processed_gap = max(raw_gap, abs(got - raw)), max(processed_gap, abs(got - proc))
    return {"raw_gap": raw_gap, "processed_gap": processed_gap, "sampled_in_kept_set": kept,
            "tokens": sum(len(c.token_ids) for c in out.outputs)}


def adapter_reads(llm: Any, api: Any, tokenizer: Any, paths: dict, reads: Callable[[], int]) -> dict[str, int]:
    """Adapter folders read from disk (``reads()``: a counter) over: an adapter requested twice, an in-place
    request of 5 greedy tokens, a third adapter id (the cache holds two: LRU evicts the first), the first again."""
    p = prompt_ids(tokenizer)
    greedy = api.SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    req = {"a": api.LoRARequest("contract-a", 11, str(paths["lora"])),
           "inplace": api.LoRARequest("contract-b", 12, str(paths["lora2"]), load_inplace=True),
           "c": api.LoRARequest("contract-c", 13, str(paths["lora"]))}
    out, before = {}, reads()
    for step, key in (("first", "a"), ("again", "a"), ("inplace", "inplace"), ("third id", "c"), ("first id again", "a")):
        llm.generate([p], greedy, use_tqdm=False, lora_request=req[key])
        now = reads()
        out[step], before = now - before, now
    return out
