"""vLLM multi-LoRA rollouts of a pack (built against vLLM 0.31's API).

One colocated engine serves every member: ``LLM(model, enable_lora=True, max_loras=K, max_lora_rank=r,
max_cpu_loras=2K)``; each step each member's current adapter is handed to the engine under a fresh
``LoRARequest(name=cell@step, lora_int_id=<next id>, lora_path)`` by :class:`EngineAdapters`, from memory where the
engine allows it (lorarl.pack.lora_memory: tensors in, no file) else from the folder it was saved to, staged and
atomic: the K new adapters are added next to the K old ones (hence 2K in the CPU cache), and only when all K are in
are the old ones removed; a failed load removes the new ones and keeps the old (``load_inplace=True`` would make
vLLM re-read a folder at every engine step, i.e. every decoded token), and ONE ``LLM.generate`` call carries all
members' prompts with a per-prompt ``lora_request`` list and per-prompt ``SamplingParams`` (n = G,
``seed`` drawn from the member's own sampling generator, so a member's samples depend on its own RNG
stream only). vLLM refuses a ``lora_request`` or params list whose length is not the number of prompts,
a LoRA rank above ``max_lora_rank``, and LoRA requests without ``enable_lora``; so does the fake.

The step loop uses it through :class:`lorarl.pack.vllm_rollouts.VLLMRollouts` (cells with ``rollout.engine: vllm``
pack; the engine and the per-step handover live there); :func:`saved_engine_lora_kwargs` gives the engine's
limits from the members' saved adapters (each checked with ``lora_servable``, the rank limit from the saved rank).
Run on vLLM's real CPU engine by tests/vllm_real/test_pack_vllm_real.py; tests/support/fake_vllm.py in the main suite.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lorarl.evaluate.vllm_backend import VLLM_LORA_RANKS, lora_servable
from lorarl.pack.generate import CellRollouts, SampleSettings

SEED_MAX = 2**31 - 1  # why: vLLM seeds are Python ints; keep them in a 31-bit range


def engine_lora_kwargs(ranks: list[int]) -> dict[str, Any]:
    """``EngineArgs`` LoRA fields for a pack of adapters of these ranks."""
    need = max(ranks)
    fits = [r for r in VLLM_LORA_RANKS if r >= need]
    if not fits:
        raise ValueError(f"LoRA rank {need} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")
    # max_cpu_loras: a step's K new adapters are loaded beside the K old ones before those go (EngineAdapters)
    return {"enable_lora": True, "max_loras": len(ranks), "max_lora_rank": fits[0], "max_cpu_loras": 2 * len(ranks)}


def saved_engine_lora_kwargs(names: list[str], adapter_dirs: list[str | Path]) -> dict[str, Any]:
    """``EngineArgs`` LoRA fields for the members' SAVED adapters: each must be servable by vLLM's LoRA path
    (:func:`lorarl.evaluate.vllm_backend.lora_servable`: no DoRA, adapter bias, ``modules_to_save``, ...), and
    the rank limit is the saved rank, not the cell's (a residual-init member is saved converted at rank 2r)."""
    ranks = []
    for name, d in zip(names, adapter_dirs, strict=True):
        ok, why = lora_servable(d)
        if not ok:
            raise ValueError(f"pack member {name}: vLLM cannot serve its adapter as a LoRA ({why}); "
                             "such a cell samples with rollout.engine: hf or trains solo")
        ranks.append(int(json.loads((Path(d) / "adapter_config.json").read_text())["r"]))
    return engine_lora_kwargs(ranks)


def lora_requests(api: Any, names: list[str], adapter_dirs: list[str | Path], version: int = 0,
                  first_id: int = 0) -> list[Any]:
    """One request per member for the adapters of ``version`` (a training step): a fresh id (``first_id + k + 1``)
    and name per member and version, never ``load_inplace``. vLLM re-applies every
    running request's adapter at each engine step (vllm/v1/worker/gpu_model_runner.py ``_prepare_inputs`` ->
    ``set_active_loras``) and ``add_adapter`` re-reads an in-place request's folder from disk every time
    (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager.add_adapter``): once per decoded token. A new id is
    read once, when first added."""
    if len(set(names)) != len(names):
        raise ValueError(f"member names must be unique: {names}")
    k_all = len(names)
    if len(adapter_dirs) != k_all:
        raise ValueError(f"{len(adapter_dirs)} adapters for {k_all} members")
    return [api.LoRARequest(lora_name=f"{n}@{version}", lora_int_id=first_id + k + 1, lora_path=str(d))
            for k, (n, d) in enumerate(zip(names, adapter_dirs))]


@dataclass
class AdapterState:
    """A member's adapter as tensors: what its saved folder would hold, kept in memory (lorarl.pack.lora_memory)."""

    tensors: dict[str, torch.Tensor]  # PEFT's state-dict names (adapter_model.safetensors), detached copies
    config: dict[str, Any]  # PEFT's adapter_config.json as a dict (r, lora_alpha, target_modules, use_rslora, ...)


class EngineAdapters:
    """The members' adapters inside one engine, one version per training step, swapped staged and atomic.

    :meth:`update` after each optimiser step: the new adapters are added under fresh ids (from memory,
    :class:`AdapterState`, through lorarl.pack.lora_memory; or from their saved folders, ``llm_engine.add_lora``:
    each read once, now), and only when every one of them is in are the previous version's removed
    (``llm_engine.remove_lora``). A load that fails removes the new ones and raises: the engine and
    :attr:`requests` keep the previous version, whole. ``bench/lora_handoff.py`` measures both paths per member.

    The engine is the pack's: adapters a previous pack left in it are removed, and ids continue after the
    largest one the engine has seen (vLLM caches an adapter by id: a repeated id would serve the old weights);
    a failed version's ids are never used again either.
    """

    def __init__(self, api: Any, llm: Any, names: list[str]):
        self.api, self.llm, self.names = api, llm, list(names)
        self.version = -1
        self.requests: list[Any] = []
        left = set(llm.llm_engine.list_loras()) if llm is not None else set()
        for i in left:
            llm.llm_engine.remove_lora(i)
        if llm is not None:
            llm.lorarl_last_lora_id = max([getattr(llm, "lorarl_last_lora_id", 0), *left])

    def update(self, adapters: list[str | Path] | list[AdapterState]) -> list[Any]:
        """Swap in the members' new adapters (folders just saved, or :class:`AdapterState` from memory), all or
        none; the new requests, one per member."""
        from lorarl.pack.lora_memory import MEMORY_SCHEME, add_from_memory

        memory = [isinstance(a, AdapterState) for a in adapters]
        if any(memory) and not all(memory):
            raise TypeError("EngineAdapters.update: adapters all in memory or all as folders, not a mix")
        version = self.version + 1
        paths = [f"{MEMORY_SCHEME}{n}@{version}" for n in self.names] if all(memory) else adapters
        new = lora_requests(self.api, self.names, paths, version, self.llm.lorarl_last_lora_id)
        self.llm.lorarl_last_lora_id = max(r.lora_int_id for r in new)  # never again, even if this load fails
        try:
            if all(memory):
                add_from_memory(self.llm, [(r.lora_int_id, a.tensors, a.config) for r, a in zip(new, adapters)])
            else:
                for r in new:
                    self.llm.llm_engine.add_lora(r)
        except Exception:
            for r in new:  # those the failed call added (a memory load adds none)
                self.llm.llm_engine.remove_lora(r.lora_int_id)
            raise
        for r in self.requests:
            self.llm.llm_engine.remove_lora(r.lora_int_id)
        self.requests, self.version = new, version
        return self.requests


@dataclass
class PackRequests:
    """What one ``LLM.generate`` call receives, and which member each prompt belongs to."""

    prompts: list[dict]  # {"prompt_token_ids": [...]} per prompt group
    params: list[Any]  # SamplingParams per prompt (n = G, the member's seed)
    loras: list[Any]  # LoRARequest per prompt
    owner: list[int]  # member index of each prompt


def build_requests(api: Any, loras: list[Any], prompts: list[list[list[int]] | None],
                   generators: list[torch.Generator | None], s: SampleSettings, generations: int,
                   logprobs: int | None = None) -> PackRequests:
    """``prompts[k]``: member k's P prompt groups (each ONCE; vLLM samples n = G per prompt), or None.
    ``logprobs=0``: vLLM returns each sampled token's logprob (the engine's ``logprobs_mode``)."""
    req = PackRequests([], [], [], [])
    for k, groups in enumerate(prompts):
        if groups is None:
            continue
        seeds = torch.randint(0, SEED_MAX, (len(groups),), generator=generators[k]).tolist()
        temperature, top_p = s.cell(k)
        for ids, seed in zip(groups, seeds):
            req.prompts.append({"prompt_token_ids": list(ids)})
            req.params.append(api.SamplingParams(n=generations, temperature=temperature, top_p=top_p, top_k=0,
                                                 max_tokens=s.max_new_tokens, seed=int(seed),
                                                 stop_token_ids=list(s.eos_token_ids) or None,
                                                 **({} if logprobs is None else {"logprobs": logprobs})))
            req.loras.append(loras[k])
            req.owner.append(k)
    return req


def generate_multilora(llm: Any, req: PackRequests, n_members: int) -> list[CellRollouts | None]:
    """One ``generate`` call for the whole pack; outputs routed back to their members (rows: G per prompt,
    prompt groups contiguous, as the packed step loop expects)."""
    outs = llm.generate(req.prompts, req.params, use_tqdm=False, lora_request=req.loras)
    if len(outs) != len(req.prompts):
        raise RuntimeError(f"vLLM returned {len(outs)} outputs for {len(req.prompts)} prompts")
    res: list[CellRollouts | None] = [None] * n_members
    for p, o, k in zip(req.prompts, outs, req.owner):
        cell = res[k] or CellRollouts([], [], [] if o.outputs and o.outputs[0].logprobs is not None else None)
        res[k] = cell
        for c in o.outputs:
            cell.prompt_ids.append(list(p["prompt_token_ids"]))
            cell.completion_ids.append(list(c.token_ids))
            if cell.logprobs is not None:  # the sampled token's logprob at each position
                cell.logprobs.append([float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)])
    return res
