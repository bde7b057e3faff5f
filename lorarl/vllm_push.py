"""Pushing new weights into a running in-process vLLM engine: the whole effective state through vLLM's layerwise
reload, the same call on a GPU and on vLLM's CPU build. Used by the trainer's colocated rollouts
(:mod:`lorarl.train.vllm_sync`), the evaluation backend's merged snapshots (:mod:`lorarl.evaluate.vllm_backend`)
and gpucheck's push job, so all three take one path (why this call and not TRL's ``load_weights``: the
docstring of :mod:`lorarl.train.vllm_sync` and docs/gpus.md).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def _cpu_backend() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM in this process: an engine stand-in (tests/support/fake_vllm.py) has nothing packed
        return False
    return current_platform.is_cpu()


def reprocess_tied_weights(model: Any) -> list[list[str]]:
    """vLLM's CPU backend: re-run the post-load processing of every module of a tied-weight group.

    vLLM's layerwise reload processes a tied parameter for one of its owners only (limitation 2 in
    vllm/model_executor/model_loader/reload/__init__.py). On the CPU the tied LM head (``lm_head.weight is
    embed_tokens.weight``) keeps the packed GEMM copy made at start-up (``dispatch_cpu_unquantized_gemm`` with
    ``remove_weight=False``), so after a push its logits would still come from the old embedding. On a GPU the
    embedding's processing is a no-op and the head reads the shared storage: nothing to do there.
    """
    groups: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and w.numel() and getattr(module, "quant_method", None) is not None:
            groups.setdefault(w.data_ptr(), []).append(name)
    tied = [names for names in groups.values() if len(names) > 1]
    for names in tied:
        for name in names:
            module = model.get_submodule(name)
            module.quant_method.process_weights_after_loading(module)
    return tied


def push_weights(llm: Any, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Replace the engine's weights by ``named_params`` (HF names, checkpoint layout), then drop the prefix cache.

    The engine core runs in this process (TRL's ``external_launcher``): the model runner is called directly and
    consumes the iterator one tensor at a time, nothing is serialised.
    """
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=iter(named_params), is_checkpoint_format=True)
    if _cpu_backend():
        reprocess_tied_weights(runner.get_model())
    llm.reset_prefix_cache()  # cached KV blocks were computed by the previous weights
