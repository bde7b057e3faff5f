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

from typing import Any

from lorarl.vllm_push import push_weights  # the push itself, shared with evaluation


def sync_weights(generation: Any, named_params: Any) -> None:
    """Stand-in for TRL's ``VLLMGeneration.sync_weights`` (colocate mode, one process): wake the weights if
    sleep mode discarded them (as TRL does), push the complete effective state (``named_params()``)."""
    if generation.enable_sleep_mode:
        from trl.generation.vllm_generation import empty_cache

        empty_cache()
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    from lorarl import ledger

    with ledger.phase("handoff"):  # inside the step's generation window; the ledger takes it out of generation
        push_weights(generation.llm, named_params())
