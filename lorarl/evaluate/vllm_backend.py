"""vLLM generation backend (GPU only; it has not yet run on a GPU: docs/gpus.md says what has).

Every call is checked against vLLM 0.31.0's source (the pinned ``.[gpu]`` extra) and exercised on the
CPU with tests/fake_vllm.py, which refuses what vLLM refuses:

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
from typing import Any, Sequence

from lorarl.evaluate.backends import Completion
from lorarl.evaluate.protocols import Protocol

__all__ = ["VLLMBackend", "lora_servable", "sampling_kwargs", "VLLM_LORA_RANKS"]

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


def _vllm_api() -> Any:
    import vllm  # noqa: PLC0415 - GPU-only dependency
    from vllm.lora.request import LoRARequest

    return SimpleNamespace(LLM=vllm.LLM, SamplingParams=vllm.SamplingParams, LoRARequest=LoRARequest)


class VLLMBackend:
    """vLLM ``LLM.generate`` with an optional adapter (LoRA request, or merged first).

    ``max_lora_rank`` defaults to the smallest rank vLLM accepts that fits the adapter.
    ``merge_dir`` is where a merged model is written when the adapter must be merged (default:
    ``<adapter>/merged``).  ``llm_kwargs`` go to ``vllm.LLM`` (e.g. ``max_model_len``,
    ``gpu_memory_utilization``, ``tensor_parallel_size``).
    """

    def __init__(self, model_path: str | Path, adapter_path: str | Path | None = None, *,
                 merge: bool = False, merge_dir: str | Path | None = None,
                 max_lora_rank: int | None = None, dtype: str = "auto", seed: int = 0,
                 use_chat_template: bool | None = None, prompt_config: Any = None, api: Any = None,
                 **llm_kwargs: Any) -> None:
        self.api = api if api is not None else _vllm_api()
        from lorarl.evaluate.backends import plain_prompt_config

        self.prompt_config = prompt_config if prompt_config is not None else plain_prompt_config(use_chat_template)
        self.lora_request = None
        self.merged_from: str | None = None
        llm_args: dict[str, Any] = dict(model=str(model_path), dtype=dtype, seed=seed, **llm_kwargs)
        if adapter_path is not None:
            servable, why = lora_servable(adapter_path, VLLM_LORA_RANKS[-1])
            if merge or not servable:
                from lorarl.evaluate.backends import merge_adapter

                out = Path(merge_dir) if merge_dir else Path(adapter_path) / "merged"
                llm_args["model"] = str(merge_adapter(model_path, adapter_path, out))
                self.merged_from = why or "merge requested"
            else:
                rank = int(json.loads((Path(adapter_path) / "adapter_config.json").read_text())["r"])
                llm_args.update(enable_lora=True, max_loras=1,
                                max_lora_rank=next(r for r in VLLM_LORA_RANKS
                                                   if r >= max(rank, max_lora_rank or 0)))
                self.lora_request = self.api.LoRARequest(
                    lora_name=Path(adapter_path).name or "adapter", lora_int_id=1,
                    lora_path=str(adapter_path))
        self.llm_args = llm_args
        self.llm = self.api.LLM(**llm_args)

    def generate(self, prompts: Sequence[str], protocol: Protocol, seed: int = 0
                 ) -> list[list[Completion]]:
        """``protocol.n`` completions for each prompt, in prompt order."""
        kwargs = sampling_kwargs(protocol, seed)
        # one request per problem with its own seed: vLLM seeds a request's generator with its seed (child j of
        # an n > 1 request: seed + j), so one seed for every problem would give every problem the same noise
        params = [self.api.SamplingParams(**{**kwargs, "seed": request_seed(seed, k, kwargs["n"])})
                  for k in range(len(prompts))]
        from lorarl.tasks.prompt import build_prompt, prompt_ids

        tokenizer = self.llm.get_tokenizer()  # the cell's prompt, tokenised exactly as in training
        inputs = [{"prompt_token_ids": prompt_ids(tokenizer, build_prompt(self.prompt_config, p, tokenizer))}
                  for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self.lora_request)
        result = []
        for req in outputs:
            result.append([Completion(o.text, len(o.token_ids), o.finish_reason == "length")
                           for o in req.outputs])
        if len(result) != len(prompts) or any(len(r) != protocol.n for r in result):
            raise RuntimeError("vLLM returned an unexpected number of completions")
        return result


def sampled_on_hf(cfg: Any) -> list[str]:
    """One line per benchmark of ``cfg`` whose protocol samples (avg@n / pass@k) under ``eval.backend: hf``."""
    from lorarl.evaluate.plan import benchmark_specs, protocol_for

    if cfg.eval.backend != "hf":
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
