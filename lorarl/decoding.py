"""The HF generation engine (``runtime.generation``): a static KV cache and a compiled decode step, or
transformers' default dynamic cache, for training rollouts (:mod:`lorarl.train.rowsample`), packed rollouts
(:mod:`lorarl.pack.generate`) and HF evaluation (:mod:`lorarl.evaluate.backends`).

Why: with the default dynamic cache every decode step grows the cache tensors (a ``torch.cat`` per layer) and
launches every kernel from Python, so a small batch is bound by the host (an H200 decoded 98-175 tokens/s for
16 rows of a Qwen3-1.7B-shaped model, CPU seconds equal to wall seconds: bench/results/gpucheck-h200.md). A
static cache (transformers' ``StaticCache``: K/V tensors of the full ``prompt + max_new_tokens`` length,
written in place) keeps every decode step's shapes fixed, so ``torch.compile`` can compile the step once (on
CUDA its default mode ``reduce-overhead`` captures it as a CUDA graph: one launch per step).

Which of transformers' options (read in the pinned 5.17 sources): ``generate(cache_implementation="static",
compile_config=...)`` compiles only the decode forward, after an eager prefill, and keeps ``generate``'s
logits processors, so lorarl's row sampler (:class:`lorarl.train.rowsample.RowSampler`) still draws row ``i``'s
step-``t`` token at its uniform ``U_NT[i, t]``: the samples are consumed exactly as before. Transformers'
continuous batching (``generate_batch``) samples with its own per-request processors and schedules rows
dynamically, so it cannot take the pre-drawn uniforms; it is not used. Packed rollouts run their own decode
loop (one forward per step with per-row adapters, :mod:`lorarl.pack.routing`); they take the static cache from
here, and stay eager (the routing's per-call row blocks are Python state a compiled graph would guard on).

Same tokens: a static cache attends over the full cache length with the unwritten slots masked, so logits may
differ from the dynamic cache's in the last bits; greedy and seeded tokens are equal on the tiny model (training
and packed rollouts: tests/train/test_rowsample.py; HF evaluation: tests/test_decoding.py; the compiled step:
bench/generation_speed.py, as compiling takes minutes on a CPU). Not yet run on a GPU. Fallbacks (each printed once per process, then the
dynamic or eager path is used): a model whose cache is not a ``Cache`` (transformers' own list: Mamba-like
models), a compile the model does not declare compilable (``_can_compile_fullgraph``), a compile asked for a
packed (routed) decode.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from lorarl.strict import Strict

CACHES = ("auto", "static", "dynamic")
COMPILES = ("auto", "on", "off")


class GenerationEngine(Strict):
    """``runtime.generation``: how the HF engine decodes (speed and memory, never the samples: a runtime setting)."""

    cache: Literal["auto", "static", "dynamic"] = "auto"  # KV cache: static = preallocated, fixed shapes (compilable); dynamic = transformers' default, grown per step; auto = static where the step is compiled, else dynamic (measured: bench/generation_speed.py)
    compile: Literal["auto", "on", "off"] = "auto"  # torch.compile of the decode step (static cache only): auto = on a CUDA device (one-off compile time pays back there), off on the CPU (measured: bench/generation_speed.py)


class RuntimeConfig(Strict):
    """``runtime``: how a cell's jobs run on their machine (never in a signature: changing it reruns nothing)."""

    generation: GenerationEngine = Field(default_factory=GenerationEngine)  # the HF engine's KV cache and compiled decode step (rollouts, packs, evaluation)
    batch_invariant: bool = False  # a packed member's numbers independent of its pack-mates' rows: vLLM engines started batch-invariant, a pack's rollouts, forwards and backwards one member at a time, batch-invariant kernels on a GPU (lorarl.numerics.invariant; slower: docs/packed.md)


@dataclass(frozen=True)
class EnginePlan:
    """What one generation call runs with, after the fallbacks."""

    static: bool  # why: a StaticCache (else transformers' DynamicCache)
    compiled: bool  # why: the decode step through torch.compile (static cache only)


_SAID: set[str] = set()


def say_once(msg: str) -> None:
    """A fallback, printed to stderr once per process."""
    if msg not in _SAID:
        _SAID.add(msg)
        print(f"[lorarl] runtime.generation: {msg}", file=sys.stderr, flush=True)


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (its class carries the cache and compile facts)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def plan(engine: GenerationEngine | None, model: Any, device_type: str, routed: bool = False) -> EnginePlan:
    """Resolve ``auto`` and apply the fallbacks for ``model`` on a ``device_type`` device (``cuda``, ``cpu``);
    ``routed``: a packed decode (several adapters routed per row)."""
    engine = engine or GenerationEngine()
    base = base_model(model)
    compile_wanted = engine.compile == "on" or (engine.compile == "auto" and device_type == "cuda")
    static = engine.cache == "static" or (engine.cache == "auto" and compile_wanted)
    name = type(base).__name__
    supports = getattr(type(base), "_supports_default_dynamic_cache", None)
    if static and (getattr(base.config, "is_encoder_decoder", False) or (supports is not None and not supports())):
        say_once(f"{name} keeps its own cache (not a transformers Cache); using its default cache, uncompiled")
        return EnginePlan(static=False, compiled=False)
    if compile_wanted and engine.compile == "on" and not static:
        say_once("compile 'on' needs cache 'static' or 'auto' (a dynamic cache changes shape every step); decoding "
                 "uncompiled")
    compiled = compile_wanted and static
    if compiled and not getattr(type(base), "_can_compile_fullgraph", False):
        say_once(f"{name} does not declare a compilable forward (_can_compile_fullgraph); static cache, uncompiled")
        compiled = False
    if compiled and routed:
        say_once("packed rollouts route adapters per row from Python; static cache, uncompiled")
        compiled = False
    return EnginePlan(static=static, compiled=compiled)


def compile_config(device_type: str) -> Any:
    """transformers' ``CompileConfig`` of the decode step: its defaults (``reduce-overhead``: CUDA graphs on
    CUDA), flagged so that ``generate`` compiles on a CPU too when asked (``compile: on``)."""
    from transformers import CompileConfig

    cc = CompileConfig()
    if device_type != "cuda":
        cc._compile_all_devices = True  # transformers' own switch (generation/configuration_utils.py)
    return cc


def apply(gen_cfg: Any, p: EnginePlan, device_type: str) -> Any:
    """``gen_cfg`` (a transformers ``GenerationConfig``) set to run ``p`` in ``generate``; returns it."""
    if p.static:
        gen_cfg.cache_implementation = "static"
    gen_cfg.disable_compile = not p.compiled
    gen_cfg.compile_config = compile_config(device_type) if p.compiled else None
    return gen_cfg


def new_cache(model: Any, p: EnginePlan, max_len: int) -> Any:
    """A fresh KV cache for a hand-written decode loop: static of ``max_len`` positions, or dynamic."""
    from transformers import DynamicCache, StaticCache

    if p.static:
        return StaticCache(config=base_model(model).config, max_cache_len=max_len)
    return DynamicCache()
