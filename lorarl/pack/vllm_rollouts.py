"""A pack's rollouts through vLLM (``rollout.engine: vllm``): one in-process engine with LoRA enabled serves every
member's adapter, ONE ``generate`` call per step (lorarl.pack.multilora builds the requests).

    rollouts = VLLMRollouts.build(model_dir, cells, policies, models, sample)   # engine: max_lora_rank = largest
    ros = rollouts(groups, generators, generations)  # after rollouts.handover(): the step's adapters in the engine

Each step (:meth:`VLLMRollouts.handover`, called by :class:`lorarl.pack.steps.PackLoop` before sampling): every
member's current adapter (residual inits converted to a plain rank-2r LoRA of the original base, as evaluation
loads them) is swapped into the engine under a fresh id, staged and atomic
(:class:`lorarl.pack.multilora.EngineAdapters`: all new ones in, then the previous step's removed; a failed load
keeps the previous step's and raises). From memory where the engine allows it (its tensors copied and handed to
the worker, lorarl.pack.lora_memory: no file), else through disk (a PEFT folder saved, read once by vLLM); the job's
log says which, and why not memory. Then one
``generate`` call carries every member's P prompts (``n = G``), each with its member's ``LoRARequest`` and a
``SamplingParams`` seeded from the member's own sampling generator (:func:`lorarl.pack.multilora.build_requests`),
so a member's requests and seeds are the same alone or packed; vLLM returns the sampled tokens and their
logprobs (``logprobs=0``, the engine's ``logprobs_mode``: ``rollout.logprobs_mode``).

The engine: ``external_launcher`` (in this process, as TRL's colocate mode), float32 for fp32 training,
``enforce_eager``, ``gpu_memory_utilization`` and the context of the ``rollout`` section, ``max_loras`` =
members and ``max_lora_rank`` = the smallest vLLM rank that fits the largest SAVED adapter. vLLM builds one engine
per process: :func:`pack_engine` keeps it and reuses it for a later pack of the same model whose adapters it can
hold (a new pack removes the old pack's adapters first; ids never repeat on an engine).

Not done here: the loss treats vLLM's samples as on-policy (no importance-sampling correction of the
sampler/trainer gap; the gap is logged as ``rollout/logp_diff_mean`` / ``_max``); ``rollout.sleep_mode`` is not
applied (the engine stays awake between steps).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lorarl import jobclock
from lorarl.pack.generate import CellRollouts, SampleSettings
from lorarl.pack.multilora import (AdapterState, EngineAdapters, build_requests, generate_multilora,
                                   saved_engine_lora_kwargs)

_ENGINE: dict[str, Any] = {}  # the process's engine: {"llm", "model", "kwargs"} (vLLM: one engine per process)
_SAME = ("dtype", "enforce_eager", "logprobs_mode", "max_model_len", "gpu_memory_utilization", "enable_lora")


def engine_args(cfg: Any, lora: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` arguments of a pack (besides the model): the rollout section's, the LoRA limits ``lora``."""
    from lorarl.evaluate.vllm_backend import inprocess_engine_kwargs
    from lorarl.sampler_logprobs import VLLM_LOGPROBS_MODES
    from lorarl.numerics.precision import resolve_precision
    from lorarl.train.trl_args import context_budget

    r, t = cfg.rollout, cfg.train
    kw = {"seed": int(cfg.seed), "gpu_memory_utilization": r.gpu_memory_utilization,
          "enforce_eager": bool(r.enforce_eager), "logprobs_mode": VLLM_LOGPROBS_MODES[r.logprobs_mode], **lora}
    if resolve_precision(t.precision, "cpu") in ("fp32", "bf16-pure"):  # as the solo engine (lorarl.train.rollout)
        kw["dtype"] = "float32"
    if r.max_model_length or context_budget(t):
        kw["max_model_len"] = r.max_model_length or context_budget(t)
    return {**kw, **inprocess_engine_kwargs()}


def _covers(have: dict[str, Any], need: dict[str, Any]) -> bool:
    return (all(have.get(k) == need.get(k) for k in _SAME) and have["max_lora_rank"] >= need["max_lora_rank"]
            and have["max_loras"] >= need["max_loras"])


def pack_engine(api: Any, model_dir: str, kwargs: dict[str, Any]) -> Any:
    """The process's engine for ``model_dir``: the one already built if it serves this model with these settings,
    holds at least these adapters (rank and count) and was started batch-invariant or not as vLLM's switch now says
    (``VLLM_BATCH_INVARIANT``: lorarl.numerics.invariant), else a new one."""
    from lorarl.numerics.invariant import vllm_on

    got = _ENGINE
    same = got.get("invariant", False) == vllm_on()  # vLLM's kernels keep the switch they started with
    if got and got["model"] == str(model_dir) and _covers(got["kwargs"], kwargs) and same:
        return got["llm"]
    _ENGINE.clear()  # old engines go first: a vLLM engine collected after the new one is built tears down the
    gc.collect()  # process's parallel groups, the new engine's too ("pipeline model parallel group is not initialized")
    t0 = time.perf_counter()
    llm = api.LLM(model=str(model_dir), **kwargs)
    jobclock.startup("engine", time.perf_counter() - t0)  # the job's start-up, never a step's (lorarl.jobclock)
    print(f"[lorarl] pack: vLLM engine for {model_dir} (max_loras {kwargs.get('max_loras')}, max_lora_rank "
          f"{kwargs.get('max_lora_rank')}{', batch-invariant' if vllm_on() else ''})", flush=True)
    _ENGINE.update(llm=llm, model=str(model_dir), kwargs=dict(kwargs), invariant=vllm_on())
    return llm


class VLLMRollouts:
    """The members' adapters in one engine and the pack's one ``generate`` call per step."""

    def __init__(self, api: Any, llm: Any, names: list[str], save: list[Any], models: list[Any],
                 sample: SampleSettings, work_dir: str | Path | None = None, states: list[Any] | None = None):
        self.api, self.llm, self.names, self.save, self.models, self.sample = api, llm, names, save, models, sample
        self.states = states  # per member: model -> (tensors, PEFT config) (lorarl.adapters.build.adapter_state)
        self.memory = False  # True: adapters handed over from memory (set by build, where the engine takes them)
        self._sets: list[list[dict]] = [[{}, {}] for _ in names]  # per member: two tensor sets, copied into in turn
        self._live = 0  # the set the engine holds now (vLLM keeps CPU tensors as given): the next step writes the other
        self.work = Path(work_dir or tempfile.mkdtemp(prefix="lorarl_pack_vllm_"))
        self.adapters = EngineAdapters(api, llm, names)
        self.handovers = 0  # adapter sets handed to the engine (one per step)
        self.calls = 0  # generate calls (one per step)
        self._dirs: list[Path] = []

    @classmethod
    def build(cls, cells: list[Any], policies: list[Any], models: list[Any], model_dir: str, sample: SampleSettings,
              api: Any = None, llm: Any = None) -> "VLLMRollouts":
        """The pack's engine (``llm``, or :func:`pack_engine`), its limits from the members' saved adapters."""
        if api is None:
            from lorarl.evaluate.vllm_backend import _vllm_api

            api = _vllm_api()
        names = [c.id for c in cells]
        from functools import partial

        from lorarl.adapters.build import adapter_state
        from lorarl.pack.lora_memory import unavailable

        out = cls(api, None, names, [p.save for p in policies], models, sample,
                  states=[partial(adapter_state, p) for p in policies])
        dirs = out._save_all()  # once, at the start: what vLLM can serve, and the ranks
        lora = saved_engine_lora_kwargs(names, dirs)  # refuses, naming it, a member vLLM cannot serve (DoRA, ...)
        out.llm = llm if llm is not None else pack_engine(api, model_dir, engine_args(cells[0].config, lora))
        out.adapters = EngineAdapters(api, out.llm, names)
        why = unavailable(out.llm)
        out.memory = not why
        print("[lorarl] pack: members' adapters handed to vLLM from memory each step (no file)" if out.memory else
              f"[lorarl] pack: members' adapters handed to vLLM through disk each step (a folder per member; "
              f"the in-memory path is not available: {why})", flush=True)
        return out

    def _save_all(self) -> list[Path]:
        step = self.work / f"v{self.handovers}"
        dirs = [Path(self.save[k](step / n, self.models[k])) for k, n in enumerate(self.names)]
        return dirs

    def handover(self) -> list[Any]:
        """Every member's current adapter swapped into the engine (fresh ids, all or none): from memory, else
        saved once and read by vLLM once; the requests."""
        if self.memory:
            free = 1 - self._live
            got = [AdapterState(*self.states[k](m, out=self._sets[k][free] or None)) for k, m in enumerate(self.models)]
            reqs = self.adapters.update(got)  # raises with the live set still in the engine, untouched
            for k, a in enumerate(got):
                self._sets[k][free] = a.tensors
            self._live = free
            self.handovers += 1
            return reqs
        dirs = self._save_all()
        reqs = self.adapters.update(dirs)  # vLLM reads each folder now, once
        for d in self._dirs:
            shutil.rmtree(d.parent, ignore_errors=True)
        self._dirs = dirs
        self.handovers += 1
        return reqs

    def __call__(self, groups: list[list[list[int]] | None], generators: list[torch.Generator | None],
                 generations: int) -> list[CellRollouts | None]:
        """``groups[k]``: member k's P prompts (each once; vLLM samples ``generations`` per prompt) or None."""
        if not self.adapters.requests:
            raise RuntimeError("VLLMRollouts: hand the adapters over (handover()) before sampling")
        req = build_requests(self.api, self.adapters.requests, groups, generators, self.sample, generations,
                             logprobs=0)
        self.calls += 1
        return generate_multilora(self.llm, req, len(self.names))

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def logp_gap(sampler: list[list[float]], policy_BT: torch.Tensor) -> dict[str, float]:
    """|sampler logprob − the update's policy logprob| of every sampled token: mean and max (nats/token), the
    solo trainer's ``rollout/logp_diff_mean`` / ``_max``."""
    diffs = [abs(a - float(policy_BT[i, j])) for i, row in enumerate(sampler) for j, a in enumerate(row)]
    if not diffs:
        return {}
    return {"rollout/logp_diff_mean": sum(diffs) / len(diffs), "rollout/logp_diff_max": max(diffs)}
