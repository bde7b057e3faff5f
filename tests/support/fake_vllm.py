"""A CPU stand-in for the parts of vLLM 0.31.0 that TRL 1.16 and lorarl call, refusing what vLLM refuses.

Checked against vLLM 0.31.0's source (the wheel's vllm/entrypoints/llm.py, vllm/sampling_params.py,
vllm/lora/request.py, vllm/outputs.py, vllm/logprobs.py, vllm/config/lora.py, vllm/engine/arg_utils.py):

* One engine per process: vLLM does not free an engine's GPU memory on ``del``, so a second ``LLM`` in a process
  fails its startup memory check (vllm/v1/worker/utils.py ``request_memory``); the fake refuses any second ``LLM``
  (``LLM.instances``; tests/conftest.py empties it per test: one test, one process). vLLM's CPU build builds a
  second in-process engine when host memory holds both KV caches (tests/vllm_real): this refusal is the GPU's.
* ``LLM(model, **kw)``: ``kw`` must be one of LLM's named parameters or an ``EngineArgs`` field
  (else TypeError, as the EngineArgs dataclass raises); ``max_lora_rank`` in vLLM's Literal set;
  ``logprobs_mode`` in its Literal set; ``gpu_memory_utilization`` in (0, 1].
* ``LLM.generate(prompts, sampling_params=None, *, use_tqdm, lora_request, ...)``: prompts are strings
  or ``{"prompt_token_ids": [...]}``; ``sampling_params`` and ``lora_request`` may be one object or a
  list with one per prompt (a list of another length is refused with VLLMValidationError, which in vLLM 0.31 is
  not a ValueError: vllm/exceptions.py);
  a ``lora_request`` without ``enable_lora`` is refused, as is an adapter whose rank exceeds
  ``max_lora_rank``. A request with ``seed`` samples from its own generator (vLLM's per-request seed; child j of an n > 1 request: seed + j).
  Adapters are loaded (``adapter_loads``) once per ``lora_int_id`` while cached (LRU, ``max_cpu_loras``), and a
  ``load_inplace=True`` request at EVERY engine step it runs in (its prefill and each decoded token), as vLLM 0.26
  and 0.31 do (gpu_model_runner.py ``_prepare_inputs`` -> ``set_active_loras`` -> worker_manager.py
  ``add_adapter``); ``llm_engine.add_lora`` / ``remove_lora`` / ``list_loras`` as vLLM's LLMEngine; ``LLM.apply_adapters = True`` makes the fake apply their weights (default: the base model
  samples, the request is only checked). Refused while asleep (weights or KV cache released).
* ``sleep(level)``: level 1 keeps the weights (offloaded), level 2 DISCARDS them (here: NaN), so
  generating after ``wake_up`` without re-pushing the weights gives NaN logprobs, as on a GPU.
* ``llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, tensor)])``: the
  path TRL's colocate sync uses; an unknown name raises KeyError, a wrong shape raises, like vLLM's loaders.
  On vLLM's CPU build (``api(cpu=True)``) a linear layer's weight raises AttributeError (no ``weight_loader``
  after the CPU repacking); ``model_runner.reload_weights(weights_iterator=...)`` loads on both
  (tests/support/fake_vllm_weights.py).
  It exists only for an in-process engine core (``distributed_executor_backend="external_launcher"``, as TRL
  builds it: vllm/config/parallel.py then sets VLLM_ENABLE_V1_MULTIPROCESSING=0, and only then does
  vllm/v1/engine/llm_engine.py set ``self.model_executor``); a default engine runs its core in another process.
* ``SamplingParams``: the fields of vLLM 0.31.0 only (TypeError otherwise) and ``_verify_args``'s checks:
  temperature in [0, 2], top_p in (0, 1], integer top_k >= -1, min_p in [0, 1], max_tokens >= 1, ...
* Outputs: ``RequestOutput(prompt_token_ids, outputs=[CompletionOutput(index, text, token_ids,
  cumulative_logprob, logprobs=[{token_id: Logprob(logprob, rank, decoded_token)}], finish_reason)])``;
  the sampled token's logprob follows the engine's ``logprobs_mode`` (vLLM's default ``raw_logprobs``: the raw
  logits' log_softmax, before temperature; ``processed_logprobs``, TRL's: after temperature and top-k/top-p,
  renormalised over the kept tokens); EOS is included in ``token_ids`` (finish_reason "stop").

``stale=True`` makes ``load_weights`` accept and drop the update: the engine keeps sampling the
weights it was built from (the stale-rollout bug the freshness gate exists for).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tests.support.fake_vllm_fields import ENGINE_ARGS, LLM_PARAMS, LOGPROBS_MODES, MAX_LORA_RANKS, SAMPLING_FIELDS
from tests.support.fake_vllm_weights import Runner, reload_weights


class VLLMError(Exception):  # vllm/exceptions.py (0.31): vLLM's own errors are not ValueErrors
    pass


class VLLMClientError(VLLMError):
    pass


class VLLMValidationError(VLLMClientError):
    pass


class SamplingParams:
    def __init__(self, **kw: Any):
        unknown = set(kw) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) {sorted(unknown)} for SamplingParams")
        d = dict(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0,
                 top_p=1.0, top_k=0, min_p=0.0, seed=None, max_tokens=16, min_tokens=0, logprobs=None,
                 stop_token_ids=None, skip_special_tokens=True)
        d.update(kw)
        self.__dict__.update(d)
        if self.seed == -1:
            self.seed = None
        self._verify()
        if self.temperature < 1e-5:  # greedy
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def clone(self) -> "SamplingParams":
        """vLLM's ``SamplingParams.clone`` (a deep copy)."""
        import copy

        return copy.deepcopy(self)

    def _verify(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        if not -2.0 <= self.presence_penalty <= 2.0 or not -2.0 <= self.frequency_penalty <= 2.0:
            raise VLLMValidationError("presence/frequency penalty must be in [-2, 2]")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise VLLMValidationError(f"repetition_penalty must be > 0, got {self.repetition_penalty}.")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an integer, got {type(self.top_k).__name__}")  # vLLM: None < -1
        if self.top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise VLLMValidationError(f"logprobs must be non-negative or -1, got {self.logprobs}.")


class LoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str = "", base_model_name: str | None = None,
                 tensorizer_config_dict: dict | None = None, load_inplace: bool = False,
                 is_3d_lora_weight: bool = False):
        if lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {lora_int_id}")
        assert lora_path, "lora_path cannot be empty"
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path
        self.load_inplace = load_inplace


class Logprob:
    def __init__(self, logprob: float, rank: int | None = None, decoded_token: str | None = None):
        self.logprob, self.rank, self.decoded_token = logprob, rank, decoded_token


class CompletionOutput:
    def __init__(self, index, text, token_ids, cumulative_logprob, logprobs, finish_reason=None, stop_reason=None):
        self.index, self.text, self.token_ids = index, text, token_ids
        self.cumulative_logprob, self.logprobs = cumulative_logprob, logprobs
        self.finish_reason, self.stop_reason = finish_reason, stop_reason


class RequestOutput:
    def __init__(self, request_id, prompt, prompt_token_ids, prompt_logprobs, outputs, finished, **kw):
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.prompt_logprobs, self.outputs, self.finished = prompt_logprobs, outputs, finished


class LLM:
    instances: list["LLM"] = []
    stale_default = False  # tests flip it to build engines that ignore weight updates
    apply_adapters = False  # tests flip it: LoRA requests sample from base + that adapter
    cpu_build = False  # vLLM's CPU build: model.load_weights cannot reach the repacked linear layers

    def __init__(self, model: str, **kw: Any):
        unknown = set(kw) - LLM_PARAMS - ENGINE_ARGS
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword argument(s) {sorted(unknown)}")
        if not 0 < kw.get("gpu_memory_utilization", 0.92) <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if kw.get("tensor_parallel_size", 1) != 1:
            raise ValueError("fake vLLM runs one rank")
        if kw.get("enable_lora") and kw.get("max_lora_rank", 16) not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {MAX_LORA_RANKS}, got {kw.get('max_lora_rank')}")
        if kw.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        if LLM.instances:  # vLLM does not free an engine's GPU memory on `del`: the next one fails this check
            raise ValueError(  # vllm/v1/worker/utils.py request_memory (0.26 and 0.31)
                f"Free memory on device cuda:0 (0.0/79.2 GiB) on startup is less than desired GPU memory utilization "
                f"({kw.get('gpu_memory_utilization', 0.92)}): {len(LLM.instances)} engine(s) already built in this process")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.kwargs = dict(model=model, **kw)
        # vLLM's batch-invariant switch, read from the process's environment when the engine starts (vllm/envs.py)
        self.batch_invariant = os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0")
        dtype = kw.get("dtype", "auto")  # vLLM: "auto" = the checkpoint's dtype
        dtype = dtype if dtype == "auto" else getattr(torch, {"half": "float16", "float": "float32"}.get(dtype, dtype))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU box runs the sampler in bf16 there
        self.hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.stale = LLM.stale_default
        self.loaded: list[str] = []
        self.load_calls = 0
        self.sleep_level = 0
        self.asleep: set[str] = set()
        self.generate_calls = 0
        self.seed = int(kw.get("seed", 0))
        self.adapters: dict[int, Any] = {}  # lora_int_id -> model with that adapter applied (vLLM's LoRA cache)
        self.adapter_loads = 0
        max_len = kw.get("max_model_len") or self.hf_model.config.max_position_embeddings
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(
            max_model_len=max_len, logprobs_mode=kw.get("logprobs_mode", "raw_logprobs")))
        self.llm_engine.add_lora, self.llm_engine.remove_lora = self._engine_add_lora, self._engine_remove_lora
        self.llm_engine.list_loras = lambda: set(self.adapters)
        if kw.get("distributed_executor_backend") == "external_launcher":  # in-process engine core only then
            self.llm_engine.model_executor = SimpleNamespace(driver_worker=SimpleNamespace(
                model_runner=SimpleNamespace(model=Runner(self), reload_weights=lambda **kw: reload_weights(self, **kw))))
        LLM.instances.append(self)

    # ---------------------------------------------------------------- engine control
    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.kwargs.get("enable_sleep_mode"):
            raise ValueError("Sleep mode is not enabled in the model config")
        self.sleep_level = level
        if level >= 1:
            self.asleep = {"weights", "kv_cache"}
        if level == 2:  # weights discarded: their memory is garbage until they are loaded again
            with torch.no_grad():
                for p in self.hf_model.parameters():
                    p.fill_(float("nan"))

    def wake_up(self, tags: list[str] | None = None) -> None:
        bad = set(tags or []) - {"weights", "kv_cache", "scheduling"}
        if bad:
            raise ValueError(f"unknown wake_up tags {sorted(bad)}")
        self.asleep -= set(tags) if tags else set(self.asleep)

    # ---------------------------------------------------------------- generation
    def _check_lora(self, lora_request) -> None:
        if lora_request is None:
            return
        if not self.kwargs.get("enable_lora"):
            raise VLLMValidationError(f"Got lora_request {lora_request.lora_name} but LoRA is not enabled!")
        r = json.loads((Path(lora_request.lora_path) / "adapter_config.json").read_text())["r"]
        if r > self.kwargs.get("max_lora_rank", 16):
            raise ValueError(f"LoRA rank {r} is greater than max_lora_rank {self.kwargs.get('max_lora_rank', 16)}")

    def _processed_logits(self, logits_V: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
        """The logits vLLM samples from: temperature, then top-k and top-p masked to -inf (vllm/v1/sample/sampler.py
        ``sample``; ops/topk_topp_sampler.py ``apply_top_k_top_p_pytorch``: ascending sort, a token is dropped when
        the cumulative probability up to it is <= 1 - top_p, the most likely one always kept). Greedy: untouched."""
        x = logits_V.float()
        if sp.temperature < 1e-5:
            return x
        x = x / sp.temperature
        if sp.top_k and sp.top_k > 0:
            kth = torch.topk(x, min(sp.top_k, x.numel())).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if sp.top_p < 1.0:
            srt, idx = x.sort()
            drop = torch.softmax(srt, -1).cumsum(-1) <= 1 - sp.top_p
            drop[-1] = False
            x = x.clone()
            x[idx[drop]] = float("-inf")
        return x

    def _returned_logprobs(self, logits_V: torch.Tensor, processed_V: torch.Tensor) -> torch.Tensor:
        """What ``logprobs`` reports under the engine's ``logprobs_mode`` (vLLM's default raw_logprobs: the raw
        logits' log_softmax, before penalties and temperature; processed_*: after temperature and top-k/top-p)."""
        mode = self.kwargs.get("logprobs_mode", "raw_logprobs")
        if mode.startswith("raw"):
            return torch.log_softmax(logits_V.float(), -1) if mode == "raw_logprobs" else logits_V.float()
        return torch.log_softmax(processed_V, -1) if mode == "processed_logprobs" else processed_V

    def _load_adapter(self, req) -> None:
        """vllm/lora/worker_manager.py ``_load_adapter``: the adapter folder is read from disk (and, with
        ``LLM.apply_adapters``, applied to a copy of the base); the CPU cache holds ``max_cpu_loras`` (LRU)."""
        self._check_lora(req)
        model = None
        if LLM.apply_adapters:
            import copy

            from peft import PeftModel

            model = PeftModel.from_pretrained(copy.deepcopy(self.hf_model), req.lora_path).merge_and_unload().eval()
        self.adapters.pop(req.lora_int_id, None)
        self.adapters[req.lora_int_id] = model  # insertion order = LRU order
        self.adapter_loads += 1
        while len(self.adapters) > (self.kwargs.get("max_cpu_loras") or self.kwargs.get("max_loras", 1)):
            self.adapters.pop(next(iter(self.adapters)))

    def _add_adapter(self, req) -> None:
        """``LRUCacheWorkerLoRAManager.add_adapter``: read when the id is not cached OR the request is
        ``load_inplace``; else only touched in the LRU order."""
        if req.lora_int_id not in self.adapters or req.load_inplace:
            self._load_adapter(req)
        else:
            self.adapters[req.lora_int_id] = self.adapters.pop(req.lora_int_id)

    def _adapter_model(self, lora_request) -> Any:
        """The model a request samples from: base + its adapter (with ``apply_adapters``), else the base."""
        if lora_request is None or not LLM.apply_adapters:
            return self.hf_model
        if lora_request.lora_int_id not in self.adapters:
            self._add_adapter(lora_request)
        return self.adapters[lora_request.lora_int_id]

    def _engine_add_lora(self, req) -> bool:
        if not self.kwargs.get("enable_lora"):
            raise ValueError("LoRA is not enabled")
        self._add_adapter(req)
        return True

    def _engine_remove_lora(self, lora_id: int) -> bool:
        return self.adapters.pop(lora_id, 0) != 0

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        if self.asleep:
            raise RuntimeError(f"engine is asleep ({sorted(self.asleep)} released): call wake_up() first")
        prompts = prompts if isinstance(prompts, list) else [prompts]
        if isinstance(sampling_params, list) and len(sampling_params) != len(prompts):
            raise VLLMValidationError(f"The lengths of prompts ({len(prompts)}) and params ({len(sampling_params)}) "
                                      "must be the same.")
        if isinstance(lora_request, list) and len(lora_request) != len(prompts):
            raise VLLMValidationError(f"The lengths of prompts ({len(prompts)}) and lora_request ({len(lora_request)}) "
                                      "must be the same.")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        for lr in loras:
            self._check_lora(lr)
        self.generate_calls += 1
        for lr in {lr.lora_int_id: lr for lr in loras if lr is not None}.values():
            self._add_adapter(lr)  # the first engine step (prefill) applies every request's adapter
        shared = torch.Generator().manual_seed(self.seed * 1_000_003 + self.generate_calls)
        # vLLM: a seeded request samples from its own generator seeded with sp.seed, and a request with n > 1 fans
        # out into n child requests seeded sp.seed + j (v1/engine/parallel_sampling.py); one seeded SamplingParams
        # shared by a call's prompts gives every prompt the same streams. Unseeded requests share the engine's.
        def gen(sp, j):
            return shared if sp.seed is None else torch.Generator().manual_seed(sp.seed + j)
        eos0 = self.hf_model.generation_config.eos_token_id
        eos0 = set(eos0 if isinstance(eos0, (list, tuple)) else [eos0 if eos0 is not None else self.tokenizer.eos_token_id])
        outs = []
        for i, (p, sp, lr) in enumerate(zip(prompts, sps, loras)):
            eos = eos0 | set(sp.stop_token_ids or [])
            ids = list(p["prompt_token_ids"]) if isinstance(p, dict) else self.tokenizer(p)["input_ids"]
            model = self._adapter_model(lr)
            comps = [self._sample(ids, sp, gen(sp, j), eos, j, model) for j in range(sp.n)]
            outs.append(RequestOutput(str(i), None if isinstance(p, dict) else p, ids, None, comps, True))
        # every later engine step re-applies the running requests' adapters (gpu_model_runner.py _prepare_inputs ->
        # set_active_loras -> add_adapter): an in-place request's folder is read again at each of them
        steps: dict[int, int] = {}
        for lr, out in zip(loras, outs):
            if lr is not None and lr.load_inplace:
                steps[lr.lora_int_id] = max(steps.get(lr.lora_int_id, 0), *(len(c.token_ids) for c in out.outputs))
        self.adapter_loads += sum(max(n - 1, 0) for n in steps.values())
        return outs

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], sp: SamplingParams, gen, eos: set[int], index: int,
                model: Any = None) -> CompletionOutput:
        model = self.hf_model if model is None else model
        ids = torch.tensor([prompt_ids], device=self.device)
        out = model(ids, use_cache=True)
        past, token_ids, logprobs, finish = out.past_key_values, [], [], "length"
        logits_V = out.logits[0, -1]
        for _ in range(sp.max_tokens):
            x_V = self._processed_logits(logits_V, sp)
            lp_V = torch.log_softmax(x_V, -1)
            if sp.temperature < 1e-5:
                tok = int(lp_V.argmax())
            else:
                probs = torch.nan_to_num(torch.exp(lp_V), nan=0.0).cpu()
                tok = int(torch.multinomial(probs, 1, generator=gen)) if probs.sum() > 0 else 0
            token_ids.append(tok)
            if sp.logprobs is not None:
                out_V = self._returned_logprobs(logits_V, x_V)
                rank = int((out_V > out_V[tok]).sum()) + 1
                logprobs.append({tok: Logprob(float(out_V[tok]), rank, self.tokenizer.decode([tok]))})
            if tok in eos:
                finish = "stop"
                break
            out = model(torch.tensor([[tok]], device=self.device), past_key_values=past, use_cache=True)
            past, logits_V = out.past_key_values, out.logits[0, -1]
        text = self.tokenizer.decode(token_ids, skip_special_tokens=sp.skip_special_tokens)
        return CompletionOutput(index, text, token_ids, None, logprobs if sp.logprobs is not None else None, finish)


def fresh_process() -> None:
    """Forget the engines built so far: what follows runs as in a new process (vLLM: one engine per process)."""
    LLM.instances = []


def install(monkeypatch, stale: bool = False) -> type[LLM]:
    """Route TRL's colocated vLLM generation to this fake (what ``use_vllm=True`` imports on a GPU box)."""
    from trl.generation import vllm_generation as vg

    LLM.instances = []
    LLM.stale_default = stale
    LLM.apply_adapters = False
    LLM.cpu_build = False
    monkeypatch.setattr(vg, "is_vllm_available", lambda *a, **k: True, raising=False)
    monkeypatch.setattr(vg, "LLM", LLM, raising=False)
    monkeypatch.setattr(vg, "SamplingParams", SamplingParams, raising=False)
    monkeypatch.setattr(vg, "RequestOutput", RequestOutput, raising=False)
    return LLM


def api(cpu: bool = False) -> SimpleNamespace:
    """The namespace lorarl.evaluate.vllm_backend takes in place of ``vllm`` (``cpu``: vLLM's CPU build)."""
    LLM.cpu_build = cpu
    return SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, LoRARequest=LoRARequest, cpu=cpu)
