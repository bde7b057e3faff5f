"""Handing LoRA adapters to an in-process vLLM engine from memory: tensors in, no file written or read.

vLLM 0.31 takes a LoRA only as a folder (``LoRARequest.lora_path``; the worker's ``LRUCacheWorkerLoRAManager``
``_load_adapter`` -> ``LoRAModel.from_local_checkpoint``). The folder's reader ends in
``LoRAModel.from_lora_tensors``, which takes a dict of tensors; these functions run on the worker (through
``LLM.collective_rpc``: in this process for the pack's in-process engine, so tensors are passed, not copied) and do
what ``_load_adapter`` + ``add_adapter`` do, from tensors:

1. stage, for every adapter: the PEFT config as ``PEFTHelper.from_dict`` + ``validate_legal`` (rank <= the engine's
   ``max_lora_rank``, no DoRA, no bias), every tensor name checked against the modules the model supports (as
   ``from_local_checkpoint``'s ``check_unexpected_modules``), then ``from_lora_tensors`` (on the CPU, the engine's
   LoRA dtype). Any failure raises here, before the engine changed;
2. commit: each staged ``LoRAModel`` added to the manager's cache and activated (copied into a slot of the stacked
   LoRA buffers, where a wrong shape fails). A failure removes the adapters this call added, then raises: the
   engine holds what it held before (the previous step's adapters stay registered: the pack's engine caches
   2K adapters, ``max_cpu_loras``, so adding K new never evicts the K old ones).

The requests that then sample with them carry the ids and a ``lora_path`` naming the member and step
(``memory://cell@step``): vLLM finds the id in its cache and never reads the path (it would fail loudly if it tried).
:func:`unavailable` says why an engine cannot take this path (no in-process worker, another vLLM); the caller then
hands adapters over through disk (lorarl.pack.multilora.EngineAdapters) and says so in the log.
"""

from __future__ import annotations

import contextlib
from typing import Any

MEMORY_SCHEME = "memory://"  # the lora_path of an adapter handed over from memory (never read)


def _manager(worker: Any) -> Any:
    runner = getattr(worker, "model_runner", None)
    mgr = getattr(runner, "lora_manager", None)
    if mgr is None or not hasattr(mgr, "_adapter_manager"):
        raise RuntimeError("the worker has no LoRA manager (engine built without enable_lora?)")
    return mgr


def _probe(worker: Any) -> str:
    """'' when this worker takes adapters from memory, else why not."""
    try:
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        mgr = _manager(worker)
    except (ImportError, RuntimeError) as e:
        return str(e)
    for owner, name in ((LoRAModel, "from_lora_tensors"), (PEFTHelper, "from_dict"),
                        (mgr._adapter_manager, "activate_adapter"), (mgr._adapter_manager, "capacity")):
        if not hasattr(owner, name):
            return f"vLLM {_version()} has no {getattr(owner, '__name__', type(owner).__name__)}.{name}"
    return ""


def _version() -> str:
    try:
        import vllm

        return vllm.__version__
    except ImportError:
        return "(not importable)"


def unavailable(llm: Any) -> str:
    """'' when ``llm`` takes adapters from memory (:func:`add_from_memory`), else the reason it does not."""
    if not callable(getattr(llm, "collective_rpc", None)):
        return f"{type(llm).__name__} has no collective_rpc (not vLLM's LLM)"
    try:
        return next(iter(llm.collective_rpc(_probe)), "no worker answered")
    except Exception as e:  # noqa: BLE001 -- any failure to reach the worker means: use the disk path
        return f"collective_rpc failed: {type(e).__name__}: {e}"


def _expected_modules(mgr: Any) -> set[str]:
    """The module names an adapter may target (as ``_load_adapter`` computes them)."""
    am = mgr._adapter_manager
    out: set[str] = set()
    for module in am.supported_lora_modules:
        out.update(am.packed_modules_mapping.get(module, [module]))
    return out


def _stage(mgr: Any, lora_id: int, tensors: dict[str, Any], config: dict[str, Any]) -> Any:
    """One ``LoRAModel`` from tensors, validated as vLLM validates a folder; nothing in the engine changes."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.utils import is_base_embedding_weights, parse_fine_tuned_lora_name

    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": mgr.max_position_embeddings})
    helper.validate_legal(mgr.lora_config)
    mapper = getattr(mgr._adapter_manager.model, "hf_to_vllm_mapper", None)
    mapper = mapper.get_rename_mapper() if mapper is not None else None
    expected = _expected_modules(mgr)
    bad = [name for name in tensors if not is_base_embedding_weights(name)
           and parse_fine_tuned_lora_name(name, mapper)[0].rsplit(".", 1)[-1] not in expected]
    if bad:
        raise ValueError(f"adapter {lora_id}: modules {sorted(bad)[:4]} are not among the model's LoRA targets "
                         f"{sorted(expected)}")
    return LoRAModel.from_lora_tensors(lora_model_id=lora_id, tensors=tensors, peft_helper=helper, device="cpu",
                                       dtype=mgr.lora_config.lora_dtype, model_vocab_size=mgr.vocab_size,
                                       weights_mapper=mapper)


def _add(worker: Any, items: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> list[int]:
    """Worker side of :func:`add_from_memory`: stage every adapter, then commit them all or none."""
    mgr = _manager(worker)
    am = mgr._adapter_manager
    staged = [_stage(mgr, i, tensors, config) for i, tensors, config in items]
    if len(am) + len(staged) > am.capacity:
        raise RuntimeError(f"the engine's LoRA cache holds {am.capacity} adapters, {len(am)} are in it: "
                           f"{len(staged)} more would evict adapters in use (max_cpu_loras too small)")
    try:
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed
    except ImportError:
        gpu_sync_allowed = contextlib.nullcontext
    added: list[int] = []
    try:
        with gpu_sync_allowed():
            for lora in staged:
                if lora.id in am.list_adapters():
                    raise ValueError(f"adapter id {lora.id} is already in the engine")
                am.add_adapter(lora)
                added.append(lora.id)
                am.activate_adapter(lora.id)
    except BaseException:
        for i in added:
            am.remove_adapter(i)
        raise
    return added


def add_from_memory(llm: Any, items: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> None:
    """Add adapters ``(lora_int_id, tensors, PEFT config dict)`` to ``llm`` from memory, all or none (raises
    with the engine as it was). The caller removes the adapters they replace (``llm_engine.remove_lora``)."""
    llm.collective_rpc(_add, args=(items,))
