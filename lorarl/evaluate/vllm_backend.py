"""vLLM generation backend (a GPU, or vLLM's CPU build: tests/vllm_real runs it there; docs/gpus.md says what has run).

Every call is checked against vLLM 0.31.0's source (the pinned ``.[gpu]`` extra) and exercised on the
CPU with tests/support/fake_vllm.py, which refuses what vLLM refuses:

* ``vllm.LLM(model, dtype, seed, enable_lora, max_loras, max_lora_rank, **llm_kwargs)``: the LoRA
  fields are ``EngineArgs`` fields; ``max_lora_rank`` must be one of vllm/config/lora.py's
  ``MaxLoRARanks`` (1, 8, 16, 32, 64, 128, 256, 320, 512).
* ``SamplingParams(n, temperature, top_p, top_k, max_tokens, seed)``: ``_verify_args`` refuses a
  temperature outside [0, 2] and top_p outside (0, 1]; top-k disabled is 0 (-1 only "quietly accepted").
* ``LoRARequest(lora_name, lora_int_id >= 1, lora_path)``; vllm/lora/peft_helper.py refuses DoRA,
  adapter bias, ``modules_to_save`` (other than classifier/score) and a rank above ``max_lora_rank``,
  and reads only ``r``/``lora_alpha``/``use_rslora`` (per-module ``rank_pattern``/``alpha_pattern``
  would be served with the wrong scale): those adapters are merged first (see :func:`lora_servable`).
* ``LLM.generate(prompts, params, use_tqdm=False, lora_request=...)`` → ``RequestOutput.outputs`` of
  ``CompletionOutput(text, token_ids, finish_reason)``; ``params`` is one ``SamplingParams`` per problem, each
  with its own seed (:func:`request_seed`): vLLM samples a seeded request from a generator seeded with that
  seed (child j of an n > 1 request: seed + j), so one shared seed would correlate every problem's samples.

Same interface as :class:`lorarl.evaluate.backends.HFBackend`.  Plain LoRA adapters (including
rsLoRA) are served with a ``LoRARequest`` on top of the base model; adapters vLLM cannot apply at
run time (DoRA, non-LoRA peft methods, ``modules_to_save``, rank above ``max_lora_rank``) are
merged into the base weights first (:func:`lorarl.evaluate.backends.merge_adapter`) and served as a
plain model.  ``vllm`` is imported lazily; tests inject a fake ``api`` namespace instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Iterator, Sequence

from lorarl.evaluate.backends import Completion
from lorarl.grading.protocols import Protocol
from lorarl.vllm_push import push_weights

__all__ = ["VLLMBackend", "lora_servable", "sampling_kwargs", "serving_mode", "VLLM_LORA_RANKS"]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # max_lora_rank values vLLM 0.31.0 accepts
VLLM_MAX_TEMPERATURE = 2.0  # SamplingParams._verify_args: temperature must be in [0, 2]


def lora_servable(adapter_path: str | Path, max_rank: int = VLLM_LORA_RANKS[-1]) -> tuple[bool, str]:
    """Whether vLLM can serve this peft adapter as a LoRA, and why not."""
    cfg = json.loads((Path(adapter_path) / "adapter_config.json").read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        return False, f"peft type {cfg.get('peft_type')} is not LoRA"
    if cfg.get("use_dora"):
        return False, "DoRA is not supported by vLLM"
    if cfg.get("modules_to_save"):
        return False, "modules_to_save is not supported by vLLM"
    if cfg.get("bias", "none") != "none" or cfg.get("lora_bias"):
        return False, "adapter bias is not supported by vLLM"
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        return False, "per-module rank/alpha patterns are ignored by vLLM (it reads r and lora_alpha only)"
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    if any(t in ("lm_head", "embed_tokens") for t in targets):
        return False, "LoRA on the embeddings / lm_head is not served by vLLM's LoRA path"
    if int(cfg.get("r", 0)) > max_rank:
        return False, f"rank {cfg.get('r')} > max_lora_rank {max_rank}"
    return True, ""


def sampling_kwargs(protocol: Protocol, seed: int) -> dict[str, Any]:
    """``SamplingParams`` arguments of a protocol (top-k disabled = 0, per-request seed)."""
    if protocol.kind == "greedy":
        return dict(n=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=protocol.max_new_tokens,
                    seed=seed)
    if protocol.temperature > VLLM_MAX_TEMPERATURE:
        raise ValueError(f"protocol temperature {protocol.temperature}: vLLM accepts temperatures in "
                         f"[0, {VLLM_MAX_TEMPERATURE}]")
    return dict(n=protocol.n, temperature=protocol.temperature, top_p=protocol.top_p, top_k=0,
                max_tokens=protocol.max_new_tokens, seed=seed)


def request_seed(seed: int, problem: int, n: int) -> int:
    """The seed of problem ``problem``'s request in a cell of seed ``seed``: its n samples use seeds
    request_seed .. request_seed + n - 1 (vLLM's child requests), disjoint from every other problem's."""
    return seed * 1_000_003 + problem * n


def serving_mode(plan: Sequence[tuple[Any, Any]], merge: bool = False) -> tuple[str, str]:
    """How one engine serves every weight set of a job: ``lora`` (the same base, every adapter a LoRA vLLM can
    apply at run time), else ``merged`` (complete models, later ones pushed), with the reason for merging."""
    if merge:
        return "merged", "merge requested"
    if len({str(m) for m, _ in plan}) > 1:
        return "merged", "the job's weight sets are complete models (full fine-tuning snapshots)"
    for _, adapter in plan:
        if adapter is not None:
            ok, why = lora_servable(adapter, VLLM_LORA_RANKS[-1])
            if not ok:
                return "merged", why
    return ("lora", "") if any(a is not None for _, a in plan) else ("merged", "")


def inprocess_engine_kwargs() -> dict[str, Any]:
    """``vllm.LLM`` arguments for an engine whose model lives in this process (what TRL's colocate mode builds):
    the external-launcher executor turns vLLM's engine-core process off (vllm/config/parallel.py sets
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``llm_engine.model_executor`` exists (vllm/v1/engine/llm_engine.py)
    and weights can be pushed with ``load_weights``; it reads torch.distributed's variables of a 1-rank world."""
    import os
    import socket

    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    return {"distributed_executor_backend": "external_launcher"}


def model_weights(model_dir: str | Path) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) of a saved model folder's safetensors (what ``load_weights`` takes)."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights to push into the engine")
    for f in files:
        yield from load_file(str(f)).items()


def _vllm_api() -> Any:
    import vllm  # noqa: PLC0415 - GPU-only dependency
    from vllm.lora.request import LoRARequest

    from vllm.platforms import current_platform

    return SimpleNamespace(LLM=vllm.LLM, SamplingParams=vllm.SamplingParams, LoRARequest=LoRARequest,
                           cpu=current_platform.is_cpu())  # vLLM's CPU build: weights are pushed another way


CPU_KVCACHE_GIB = "1"  # vLLM's CPU build: the KV cache an evaluation engine gets unless the job sets one


def cpu_kv_cache_default(llm_args: dict[str, Any]) -> None:
    """vLLM's CPU build reads ``gpu_memory_utilization`` as a share of host memory for the KV cache and refuses
    vLLM's default 0.92 on a machine in use; unless the job sets ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or passes
    ``gpu_memory_utilization``, the engine gets a 1 GiB KV cache (said on stderr)."""
    import os
    import sys

    if "gpu_memory_utilization" in llm_args or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
    print(f"[lorarl] vLLM's CPU build: VLLM_CPU_KVCACHE_SPACE={CPU_KVCACHE_GIB} (GiB of KV cache; set it to change)",
          file=sys.stderr)


def longest_sequence(model_path: str | Path, prompt_config: Any, targets: Iterable[tuple[Sequence[str], Protocol]]
                     ) -> int:
    """Tokens of the longest sequence the job asks for: each target's longest prompt (the cell's prompt, tokenised as
    the engine will: the model's tokenizer) plus its ``max_new_tokens``; read before the engine starts."""
    from transformers import AutoTokenizer

    from lorarl.tasks.prompt import build_prompt, prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return max((max((len(prompt_ids(tokenizer, build_prompt(prompt_config, p, tokenizer), prompt_config))
                     for p in prompts), default=0) + protocol.max_new_tokens for prompts, protocol in targets), default=0)


def check_lengths(inputs: Sequence[dict[str, Any]], max_tokens: int, llm: Any) -> None:
    """Refuse prompts whose ``max_tokens`` would not fit the engine's ``max_model_len``: vLLM refuses a longer prompt
    and stops a request at max_model_len tokens as if its budget were spent (finish_reason ``length``), which would
    read as a truncated completion of fewer tokens than the protocol's."""
    limit = llm.llm_engine.model_config.max_model_len
    longest = max((len(i["prompt_token_ids"]) for i in inputs), default=0)
    if longest + max_tokens > limit:
        raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {max_tokens} exceeds the vLLM engine's "
                         f"max_model_len {limit} (train.max_prompt_length, else the plan's assumed prompt, + the "
                         f"longest max_new_tokens: lorarl.language.evalplan.lengths.sequence_tokens); raise "
                         f"train.max_prompt_length to at least {longest}")


class VLLMBackend:
    """vLLM ``LLM.generate`` over one engine per evaluation job, with an optional adapter.

    ``plan``: every weight set (model path, adapter path or None) the job evaluates, in order; default the one
    given. vLLM does not reliably free an engine's GPU memory on ``del`` (a second ``vllm.LLM`` in the process
    fails its startup memory check, vllm/v1/worker/utils.py ``request_memory``), so the job builds ONE engine and
    :meth:`select` moves it from one weight set to the next: as LoRA requests (every set is the base plus a
    servable LoRA: one ``lora_int_id`` per adapter, ``max_lora_rank`` fitting the largest) or as merged weights
    pushed into the engine (a set vLLM cannot serve as a LoRA, a full fine-tuning snapshot, ``merge``): the
    first set is what the engine loads, every later one is pushed (:func:`lorarl.vllm_push.push_weights`, the trainer's push:
    the model runner's ``reload_weights``; it needs vLLM's in-process executor, :func:`inprocess_engine_kwargs`).
    ``merge_dir``: where a merged model is written (default ``<adapter>/merged``). ``llm_kwargs`` go to
    ``vllm.LLM`` (e.g. ``max_model_len``, ``gpu_memory_utilization``, ``tensor_parallel_size``). ``llm``: an
    in-process engine this process already built, used instead of a new one (LoRA mode: its base and LoRA
    settings must fit the plan; merged mode: the first weight set is pushed into it too).
    """

    def __init__(self, model_path: str | Path, adapter_path: str | Path | None = None, *,
                 plan: Sequence[tuple[str | Path, str | Path | None]] | None = None,
                 merge: bool = False, merge_dir: str | Path | None = None,
                 max_lora_rank: int | None = None, dtype: str = "auto", seed: int = 0,
                 use_chat_template: bool | None = None, prompt_config: Any = None, api: Any = None,
                 llm: Any = None, **llm_kwargs: Any) -> None:
        self.api = api if api is not None else _vllm_api()
        from lorarl.evaluate.backends import plain_prompt_config

        self.prompt_config = prompt_config if prompt_config is not None else plain_prompt_config(use_chat_template)
        plan = list(plan) if plan is not None else [(model_path, adapter_path)]
        self.mode, why = serving_mode(plan, merge)
        self.lora_request = None
        self.merged_from: str | None = why or None
        self.lora_ids: dict[str, int] = {}  # adapter path -> lora_int_id (one per snapshot adapter)
        self.lora_names: dict[str, str] = {}  # adapter path -> lora_name
        self.pushes = 0  # weight sets pushed into the engine after it was built
        llm_args: dict[str, Any] = dict(model=str(model_path), dtype=dtype, seed=seed, **llm_kwargs)
        if self.mode == "lora":
            ranks = [int(json.loads((Path(a) / "adapter_config.json").read_text())["r"]) for _, a in plan if a]
            llm_args.update(enable_lora=True, max_loras=1,
                            max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= max(*ranks, max_lora_rank or 0)))
            self.loaded = str(model_path)
        else:
            self.loaded = self._plain_dir(model_path, adapter_path, merge_dir)
            self._dirs = {(str(model_path), str(adapter_path) if adapter_path is not None else None): self.loaded}
            llm_args["model"] = self.loaded
            if len({(str(m), str(a)) for m, a in plan}) > 1:
                llm_args.update(inprocess_engine_kwargs())  # later sets are pushed into this process's engine
        self.llm_args = llm_args
        if llm is not None and self.mode == "merged":
            self.loaded = ""  # whatever the engine holds: the first weight set is pushed by select
        if llm is None and getattr(self.api, "cpu", False):
            cpu_kv_cache_default(llm_args)
            llm_args.setdefault("enforce_eager", True)  # CPU build: no inductor compile (35 s vs 7 s to start here)
        self.llm = llm if llm is not None else self.api.LLM(**llm_args)
        self.select(model_path, adapter_path, merge_dir)

    def _plain_dir(self, model_path: str | Path, adapter: str | Path | None, merge_dir: str | Path | None) -> str:
        """The folder of a complete model holding this weight set (an adapter is merged into its base there)."""
        if adapter is None:
            return str(model_path)
        from lorarl.evaluate.backends import merge_adapter

        return str(merge_adapter(model_path, adapter, Path(merge_dir) if merge_dir else Path(adapter) / "merged"))

    def select(self, model_path: str | Path, adapter_path: str | Path | None = None,
               merge_dir: str | Path | None = None) -> None:
        """Point the engine at one weight set of the plan (a LoRA request, or its merged weights pushed)."""
        if self.mode == "lora":
            if str(model_path) != self.loaded:
                raise ValueError(f"{model_path}: not the base this LoRA engine serves ({self.loaded})")
            if adapter_path is None:
                self.lora_request = None
                return
            key = str(adapter_path)
            if key not in self.lora_ids:  # vLLM tells adapters apart by lora_name (LoRARequest.__eq__): unique names
                self.lora_ids[key] = len(self.lora_ids) + 1
                name = Path(key).name or "adapter"
                self.lora_names[key] = name if name not in self.lora_names.values() else f"{name}-{self.lora_ids[key]}"
            self.lora_request = self.api.LoRARequest(lora_name=self.lora_names[key], lora_int_id=self.lora_ids[key],
                                                     lora_path=key)
            return
        key = (str(model_path), str(adapter_path) if adapter_path is not None else None)
        if key not in self._dirs:
            self._dirs[key] = self._plain_dir(model_path, adapter_path, merge_dir)
        if self._dirs[key] != self.loaded:
            push_weights(self.llm, model_weights(self._dirs[key]))
            self.loaded = self._dirs[key]
            self.pushes += 1

    def _inputs(self, prompts: Sequence[str]) -> list[dict[str, Any]]:
        """vLLM's inputs of the prompts: the cell's prompt, tokenised exactly as in training."""
        from lorarl.tasks.prompt import build_prompt, prompt_ids

        tokenizer = self.llm.get_tokenizer()
        return [{"prompt_token_ids": prompt_ids(tokenizer, build_prompt(self.prompt_config, p, tokenizer), self.prompt_config)}
                for p in prompts]

    def check_budget(self, prompts: Sequence[str], protocol: Protocol) -> None:
        """Refuse, before anything is generated, prompts whose ``max_new_tokens`` would not fit ``max_model_len``."""
        check_lengths(self._inputs(prompts), protocol.max_new_tokens, self.llm)

    def generate(self, prompts: Sequence[str], protocol: Protocol, seed: int = 0
                 ) -> list[list[Completion]]:
        """``protocol.n`` completions for each prompt, in prompt order."""
        kwargs = sampling_kwargs(protocol, seed)
        # one request per problem with its own seed: vLLM seeds a request's generator with its seed (child j of
        # an n > 1 request: seed + j), so one seed for every problem would give every problem the same noise
        params = [self.api.SamplingParams(**{**kwargs, "seed": request_seed(seed, k, kwargs["n"])})
                  for k in range(len(prompts))]
        inputs = self._inputs(prompts)
        check_lengths(inputs, kwargs["max_tokens"], self.llm)
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self.lora_request)
        result = []
        for req in outputs:
            result.append([Completion(o.text, len(o.token_ids), o.finish_reason == "length")
                           for o in req.outputs])
        if len(result) != len(prompts) or any(len(r) != protocol.n for r in result):
            raise RuntimeError("vLLM returned an unexpected number of completions")
        return result


def sampled_on_hf(cfg: Any) -> list[str]:
    """One line per benchmark of ``cfg`` whose protocol samples (avg@n / pass@k) under ``eval.backend: hf`` (or
    ``auto`` where vLLM is not installed)."""
    from lorarl.language.evalplan.plan import benchmark_specs, protocol_for
    from lorarl.evaluate.engines import BACKENDS, resolve_backend

    if BACKENDS[cfg.eval.backend].vllm == "require" or resolve_backend(cfg.eval.backend, cuda=True) != "hf":
        return []
    lines = []
    for name, spec in benchmark_specs(cfg).items():
        p = protocol_for(name, spec, cfg.eval)
        if p.kind == "sample":
            lines.append(f"{name}: n={p.n} samples x {p.max_new_tokens} tokens per problem "
                         f"(up to {p.n * p.max_new_tokens:,} generated tokens each)")
    return lines


def warn_sampled_on_hf(cfg: Any, cuda: bool | None = None, stream: Any = None) -> list[str]:
    """Warn LOUDLY (stderr banner + a Python warning) when a GPU run evaluates sampled protocols with HF.

    On a GPU, HF ``generate`` of e.g. AIME's 32 samples x 32k tokens per problem takes orders of
    magnitude longer than vLLM: such a study almost surely meant ``eval.backend: vllm``. Returns the lines.
    """
    import sys
    import warnings

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    lines = sampled_on_hf(cfg) if cuda else []
    if lines:
        bar = "!" * 78
        msg = "\n".join([bar, "WARNING: sampled evaluation protocols on a GPU with eval.backend: hf", *lines,
                         "HF generate is several times slower than vLLM here; set eval.backend: vllm "
                         "(pip install -e '.[gpu]') unless this is intended.", bar])
        print(msg, file=stream or sys.stderr, flush=True)
        warnings.warn("sampled protocols evaluated with eval.backend hf on a GPU: " + "; ".join(lines),
                      stacklevel=2)
    return lines
