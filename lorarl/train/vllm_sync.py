"""The weight push into TRL's colocated vLLM engine: the whole effective state through vLLM's layerwise reload.

TRL 1.16's colocated sync calls ``model_runner.model.load_weights([(name, tensor)])`` once per parameter. That
writes into the parameters vLLM created at start-up, which only works while the layer still holds them in
checkpoint layout. vLLM 0.31's CPU backend repacks every linear layer after loading
(``UnquantizedLinearMethod.process_weights_after_loading`` → ``dispatch_cpu_unquantized_gemm``, which drops the
``weight`` parameter and its ``weight_loader``), so TRL's push raises ``AttributeError: ... 'weight_loader'``
there. vLLM's own update path for a running engine is the worker's ``reload_weights(weights_iterator=...,
is_checkpoint_format=True)`` (vllm/v1/worker/gpu_model_runner.py; the CPU model runner inherits it):
``initialize_layerwise_reload`` restores each layer's checkpoint-format parameters, ``model.load_weights``
loads the iterator, and ``finalize_layerwise_reload`` re-runs the post-load processing (the CPU repacking; on a
GPU the kernel-format processing, copied into the original storage so CUDA graphs keep their references).
The same call runs on both backends, so lorarl pushes through it everywhere (docs/gpus.md).

The reload expects every parameter of every layer (a layer is processed once all its weights arrived):
:func:`lorarl.train.rollout.effective_named_params` yields the complete effective state, adapters merged.
vLLM's versioned weight-transfer API (``LLM.start_weight_update`` / ``update_weights`` /
``finish_weight_update``) needs a transfer backend (NCCL, CUDA IPC) and a ``weight_transfer_config``: it is
for an engine in other processes or on other GPUs, not for one colocated in the trainer's process.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def _cpu_backend() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM in this process: an engine stand-in (tests/fake_vllm.py) has nothing packed
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


def sync_weights(generation: Any, named_params: Any) -> None:
    """Stand-in for TRL's ``VLLMGeneration.sync_weights`` (colocate mode, one process): wake the weights if
    sleep mode discarded them (as TRL does), push the complete effective state (``named_params()``)."""
    if generation.enable_sleep_mode:
        from trl.generation.vllm_generation import empty_cache

        empty_cache()
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    push_weights(generation.llm, named_params())
