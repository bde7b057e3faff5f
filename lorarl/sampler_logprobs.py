"""Which of vLLM's sampled-token logprobs match the trainer's (a leaf module: config and the trainer read it).

vLLM 0.26/0.31 (vllm/v1/sample/sampler.py ``Sampler.forward``, ops/topk_topp_sampler.py ``forward_native``):
``raw_logprobs`` are ``log_softmax`` of the model's logits before penalties and temperature; ``processed_logprobs``
are ``log_softmax`` after temperature and the top-k/top-p mask, i.e. renormalised over the kept tokens. TRL's
trainer scores the sampled tokens with ``log_softmax(logits / temperature)`` over the full vocabulary. So the two
agree on a healthy engine only for ``processed`` with top_p = 1 (and no top-k) or ``raw`` at temperature 1.
"""

from __future__ import annotations

VLLM_LOGPROBS_MODES = {"processed": "processed_logprobs", "raw": "raw_logprobs"}  # rollout.logprobs_mode -> vLLM's


def sampler_logprobs_mismatch(logprobs_mode: str, temperature: float, top_p: float) -> str:
    """Why vLLM's sampled-token logprobs (``rollout.logprobs_mode``) are not the trainer's full-vocabulary logprobs
    at ``train.temperature`` (vllm/v1/sample/sampler.py: raw = before temperature, processed = after temperature
    and top-k/top-p, renormalised over the nucleus), or ''. Unlike values read as staleness by the freshness gate."""
    if logprobs_mode == "processed" and top_p < 1:
        return (f"rollout.logprobs_mode 'processed' with train.top_p {top_p}: vLLM renormalises them over the nucleus, "
                "the trainer's logprobs are full-vocabulary, so the freshness gate and TRL's importance ratio read the "
                "nucleus mass as a stale engine; allowed: logprobs_mode raw (needs train.temperature 1.0) or top_p 1.0")
    if logprobs_mode == "raw" and temperature != 1.0:
        return (f"rollout.logprobs_mode 'raw' with train.temperature {temperature}: vLLM's raw logprobs are taken "
                "before temperature, the trainer's after; allowed: logprobs_mode processed (with train.top_p 1.0) "
                "or train.temperature 1.0")
    return ""
