"""What a cell is evaluated on, and when an evaluation must run again.  Pure python (no torch).

* :func:`benchmark_specs`: the cell's benchmarks (``eval.benchmarks``; default ``synthetic``);
* :func:`resolve_protocol`: a benchmark's registry protocol with the study's overrides applied;
* :func:`snapshot_steps` / :func:`eval_targets`: the ``(benchmark, step)`` evaluations of a cell
  (``step=None`` = the final adapter; the base pseudo-cell has only final targets);
* :func:`train_signature` / :func:`eval_signature`: hashes used as Snakemake params, so changing an
  evaluation setting reruns only the affected evaluations, never training.

A target is written ``<benchmark>`` or ``<benchmark>@<step>`` (the file stem of its records).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from lorarl import signature
from lorarl.evaluate.benchmarks import BENCHMARKS, get_benchmark
from lorarl.evaluate.protocols import Protocol

if TYPE_CHECKING:  # only for annotations: lorarl.config imports this module lazily
    from lorarl.config import BenchmarkEval, CellConfig, EvalConfig, ProtocolOverride
    from lorarl.evaluate.grading import GradingSettings

__all__ = ["SYNTHETIC", "TARGET_ENV", "EvalPlanError", "benchmark_specs", "resolve_protocol",
           "protocol_for", "grading_for", "cell_grading", "snapshot_steps", "curve_benchmarks", "eval_targets", "format_target",
           "parse_target", "train_signature", "eval_signature", "check_eval_config"]

SYNTHETIC = "synthetic"  # the CPU task's held-out split (rows come from the cell's task)
TARGET_ENV = "LORARL_EVAL_TARGET"  # comma list of targets one evaluate job runs (set by the rules)


class EvalPlanError(ValueError):
    """An evaluation setting cannot be honoured; the message names the field and allowed values."""


def _allowed() -> str:
    return ", ".join(sorted(BENCHMARKS))


def format_target(benchmark: str, step: int | None) -> str:
    return benchmark if step is None else f"{benchmark}@{step}"


def parse_target(text: str) -> tuple[str, int | None]:
    """``gsm8k`` -> ("gsm8k", None); ``gsm8k@20`` -> ("gsm8k", 20)."""
    name, sep, step = text.strip().partition("@")
    if sep and not step.isdigit():
        raise EvalPlanError(f"bad evaluation target {text!r}: expected <benchmark> or <benchmark>@<step>")
    return name, (int(step) if sep else None)


def resolve_protocol(default: Protocol, override: "ProtocolOverride | dict | None" = None,
                     max_new_tokens: int | None = None) -> Protocol:
    """``default`` with a global token budget, then the per-benchmark overrides, applied.

    Switching family (``kind``, or ``temperature`` 0 <-> > 0) starts from that family's defaults
    (greedy: n 1; sample: T 0.6, top-p 0.95); changing ``n`` without ``ks`` reports pass@n.
    """
    ov = override if isinstance(override, dict) else (override.model_dump(exclude_none=True)
                                                       if override is not None else {})
    ov = {k: v for k, v in ov.items() if v is not None}
    data = default.model_dump()
    if max_new_tokens is not None:
        data["max_new_tokens"] = max_new_tokens
    kind = ov.get("kind")
    if kind is None and "temperature" in ov:
        kind = "greedy" if ov["temperature"] == 0 else "sample"
    kind = kind or data["kind"]
    if kind != data["kind"]:
        budget = data["max_new_tokens"]
        data = (dict(kind="greedy", temperature=0.0, top_p=1.0, n=1, ks=(1,)) if kind == "greedy"
                else dict(kind="sample", temperature=0.6, top_p=0.95, n=1))
        data["max_new_tokens"] = budget
    if "n" in ov and "ks" not in ov and kind == "sample":
        data["ks"] = (ov["n"],)
    data.update(ov)
    if kind == "sample" and "ks" not in data:
        data["ks"] = (data["n"],)
    return Protocol.model_validate(data)


def _spec_map(ev: "EvalConfig") -> dict[str, Any]:
    return ev.specs(SYNTHETIC)


def check_eval_config(ev: "EvalConfig") -> None:
    """Field-level checks of an EvalConfig (called by its validator): names and protocols."""
    specs = _spec_map(ev)
    if not specs:
        raise EvalPlanError(f"eval.benchmarks is empty; name at least one of: {_allowed()}")
    for name, spec in specs.items():
        if name not in BENCHMARKS:
            raise EvalPlanError(f"eval.benchmarks: unknown benchmark {name!r}; allowed: {_allowed()}")
        try:
            protocol_for(name, spec, ev)
        except ValueError as err:
            errors = getattr(err, "errors", None)  # a pydantic ValidationError of Protocol
            msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in errors()) if errors else str(err)
            hint = " (its registry protocol is greedy: set temperature > 0 to sample)" if (
                get_benchmark(name).protocol.kind == "greedy" and spec.protocol.temperature is None) else ""
            raise EvalPlanError(f"eval.benchmarks.{name}.protocol: {msg}{hint}") from None
    for name in ev.curve_benchmarks or ():
        if name not in specs:
            raise EvalPlanError(f"eval.curve_benchmarks: {name!r} is not in eval.benchmarks; allowed: "
                                f"{', '.join(specs)}")


def protocol_for(name: str, spec: "BenchmarkEval", ev: "EvalConfig") -> Protocol:
    """The protocol benchmark ``name`` is evaluated under in a cell with eval settings ``ev``."""
    budget = ev.max_new_tokens
    if name == SYNTHETIC and budget is None:
        budget = get_benchmark(SYNTHETIC).protocol.max_new_tokens
    return resolve_protocol(get_benchmark(name).protocol, spec.protocol, budget)


def grading_for(name: str, spec: "BenchmarkEval | None" = None, answer_format: str | None = None,
                reward_grading: "dict[str, Any] | None" = None) -> "GradingSettings":
    """Benchmark ``name``'s grading settings, each setting from the first of: the benchmark's own
    entry in the study (``eval.benchmarks.<name>.grading`` / ``.answer_format``), the cell's training
    reward (``reward_grading`` = ``reward.grading``, ``answer_format`` = ``reward.answer_format``: what
    the prompt asks for, so training and evaluation grade alike), the registry (math-verify's
    defaults, boxed).  Multiple-choice benchmarks keep their letter grader."""
    from lorarl.evaluate.grading import GradingSettings

    bench = get_benchmark(name)
    base = bench.grading
    ov: dict[str, Any] = {}
    if bench.grader == "math":
        ov.update({k: v for k, v in (reward_grading or {}).items() if v is not None})
        fmt = (spec.answer_format if spec is not None else None) or answer_format
        if fmt is not None:
            ov["answer_format"] = fmt
    ov.update(spec.grading.model_dump(exclude_none=True) if spec is not None else {})
    ov = {k: v for k, v in ov.items() if getattr(base, k) != v}
    return GradingSettings(**{**base.to_dict(), **ov}) if ov else base


def cell_grading(cfg: "CellConfig", name: str) -> "GradingSettings":
    """The grading settings of benchmark ``name`` in a cell (see :func:`grading_for`)."""
    return grading_for(name, benchmark_specs(cfg)[name], cfg.reward.answer_format,
                       cfg.reward.grading.model_dump(exclude_none=True))


def benchmark_specs(cfg: "CellConfig") -> dict[str, "BenchmarkEval"]:
    """Benchmark name -> its settings, in the study's order.  ``synthetic`` (the default) needs the
    synthetic task unless it is given a local ``path``."""
    specs = _spec_map(cfg.eval)
    syn = specs.get(SYNTHETIC)
    if syn is not None and syn.path is None and cfg.task.name != "synthetic":
        if cfg.eval.benchmarks is None:
            raise EvalPlanError(f"eval.benchmarks is required when task.name is {cfg.task.name!r} (the "
                                f"default `synthetic` evaluates the synthetic task); allowed: {_allowed()}")
        raise EvalPlanError(f"eval.benchmarks.synthetic needs task.name 'synthetic' or a local `path` "
                            f"(task.name is {cfg.task.name!r})")
    return specs


def snapshot_steps(cfg: "CellConfig") -> list[int]:
    """Training steps whose adapter is saved and evaluated (``eval.eval_every``); the last step is
    the final adapter itself, never a snapshot."""
    n = cfg.eval.eval_every
    return list(range(n, cfg.train.steps, n)) if n else []


def curve_benchmarks(cfg: "CellConfig") -> list[str]:
    """Benchmarks evaluated at every snapshot (``eval.curve_benchmarks``, default all)."""
    specs = benchmark_specs(cfg)
    return list(cfg.eval.curve_benchmarks) if cfg.eval.curve_benchmarks else list(specs)


def eval_targets(cfg: "CellConfig", is_base: bool = False) -> list[tuple[str, int | None]]:
    """Every ``(benchmark, step)`` a cell is evaluated on: finals first, then snapshots by step."""
    finals = [(b, None) for b in benchmark_specs(cfg)]
    if is_base:
        return finals
    return finals + [(b, s) for s in snapshot_steps(cfg) for b in curve_benchmarks(cfg)]


def _hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def train_signature(cfg: "CellConfig") -> str:
    """Hash of what training depends on: the config without evaluation-only settings (only
    ``eval_every`` changes what training writes) and without runtime fields (lorarl.signature;
    it is `Cell.hash`)."""
    return signature.train_signature(cfg)


def eval_signature(cfg: "CellConfig", benchmark: str, step: int | None = None,
                   is_base: bool = False) -> str:
    """Hash of what one evaluation depends on: the weights (training signature, or the model for
    the base), the benchmark's source and resolved protocol, decoding backend and sampling seed.
    ``eval.batch_size`` is left out (memory only); grading settings count when they are not
    math-verify's defaults."""
    from lorarl.tasks.prompt import template_of

    spec = benchmark_specs(cfg)[benchmark]
    d: dict[str, Any] = {
        "weights": {"model": cfg.model} if is_base else train_signature(cfg),
        "benchmark": benchmark, "step": step, "seed": cfg.seed,
        "spec": {k: v for k, v in signature.signature_dump(spec).items() if k not in ("grading", "answer_format")},
        "protocol": protocol_for(benchmark, spec, cfg.eval).model_dump(mode="json"),
        "backend": cfg.eval.backend, "prompt": cfg.prompt.model_dump(mode="json"),
        "prompt_template": template_of(cfg, benchmark == SYNTHETIC),  # a null template resolves by source
    }
    if benchmark == SYNTHETIC and spec.path is None:
        d["task"] = cfg.task.model_dump(mode="json")
    grading = cell_grading(cfg, benchmark)
    if grading != type(grading)():  # math-verify's defaults leave signatures as they were
        d["grading"] = grading.to_dict()
    return _hash(d)
