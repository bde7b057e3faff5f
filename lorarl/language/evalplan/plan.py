"""What a cell is evaluated on, and when an evaluation must run again.  Pure python (no torch).

* :func:`benchmark_specs`: the cell's benchmarks (``eval.benchmarks``; default ``synthetic``);
* :func:`lorarl.grading.resolve.resolve_protocol`: a benchmark's registry protocol with the study's overrides applied;
* :func:`snapshot_steps` / :func:`eval_targets`: the ``(benchmark, step)`` evaluations of a cell
  (``step=None`` = the final adapter; the base pseudo-cell has only final targets; a benchmark measured
  before training, the registry's ``before_training``, only on base rows unless ``trained: true``);
* :func:`data_revision`: the dataset commit a benchmark is read at (the study's, else the registry's pin);
* :func:`train_signature` / :func:`eval_signature`: hashes used as Snakemake params, so changing an
  evaluation setting reruns only the affected evaluations, never training.

A target is written ``<benchmark>`` or ``<benchmark>@<step>`` (the file stem of its records).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from lorarl.language import signature
from lorarl.grading.benchmarks import get_benchmark
from lorarl.grading.resolve import SYNTHETIC, EvalPlanError, _allowed, _spec_map, protocol_for, trained_names

if TYPE_CHECKING:  # only for annotations (lorarl.language.config imports lorarl.grading.resolve, never this module)
    from lorarl.language.config import BenchmarkEval, CellConfig
    from lorarl.grading.verify import GradingSettings

__all__ = ["SYNTHETIC", "EvalPlanError", "benchmark_specs", "data_revision",
           "trained_benchmarks",
           "protocol_for", "grading_for", "cell_grading", "snapshot_steps", "curve_benchmarks", "eval_targets", "format_target",
           "parse_target", "train_signature", "eval_signature"]


def format_target(benchmark: str, step: int | None) -> str:
    return benchmark if step is None else f"{benchmark}@{step}"


def parse_target(text: str) -> tuple[str, int | None]:
    """``gsm8k`` -> ("gsm8k", None); ``gsm8k@20`` -> ("gsm8k", 20)."""
    name, sep, step = text.strip().partition("@")
    if sep and not step.isdigit():
        raise EvalPlanError(f"bad evaluation target {text!r}: expected <benchmark> or <benchmark>@<step>")
    return name, (int(step) if sep else None)


def grading_for(name: str, spec: "BenchmarkEval | None" = None, answer_format: str | None = None,
                reward_grading: "dict[str, Any] | None" = None) -> "GradingSettings":
    """Benchmark ``name``'s grading settings, each setting from the first of: the benchmark's own
    entry in the study (``eval.benchmarks.<name>.grading`` / ``.answer_format``), the cell's training
    reward (``reward_grading`` = ``reward.grading``, ``answer_format`` = ``reward.answer_format``: what
    the prompt asks for, so training and evaluation grade alike), the registry (math-verify's
    defaults, boxed).  A harness's entry (``Benchmark.harness``: Evalchemy's tasks) skips the reward: its
    registry grading is the harness's grader.  Multiple-choice benchmarks keep their letter grader; a format
    with an answer span (``xml_answer``: ``<answer>D</answer>``) tells it where the letter is."""
    from lorarl.grading.answer_formats import SPANS
    from lorarl.grading.verify import GradingSettings

    bench = get_benchmark(name)
    base = bench.grading
    ov: dict[str, Any] = {}
    fmt = (spec.answer_format if spec is not None else None) or answer_format
    if bench.grader == "math":
        if bench.harness is None:  # a harness's entry grades as the harness does, whatever the reward reads
            ov.update({k: v for k, v in (reward_grading or {}).items() if v is not None})
        fmt = (spec.answer_format if spec is not None else None) or (None if bench.harness else answer_format)
        if fmt is not None:
            ov["answer_format"] = fmt
    elif fmt in SPANS:  # other formats leave the letter grader (and the evaluation's signature) as it was
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
    """Benchmarks evaluated at every snapshot (``eval.curve_benchmarks``: null = all of them; [] = none, the
    snapshots are saved for the weight-space diagnostics only, e.g. paper 003's Fig. 7 through training)."""
    mine = trained_benchmarks(cfg)  # a benchmark measured before training has no snapshot of a trained cell
    if cfg.eval.curve_benchmarks is not None:
        return [b for b in cfg.eval.curve_benchmarks if b in mine]
    return mine


def trained_benchmarks(cfg: "CellConfig") -> list[str]:
    """The benchmarks a trained cell is evaluated on: all of them but those the registry measures before
    training (``before_training``: paper 001's capability envelope, on the base and teacher rows only),
    unless the study asks for one on trained cells too (``eval.benchmarks.<b>.trained: true``)."""
    return trained_names(benchmark_specs(cfg))


def eval_targets(cfg: "CellConfig", is_base: bool = False) -> list[tuple[str, int | None]]:
    """Every ``(benchmark, step)`` a cell is evaluated on: finals first, then snapshots by step (a base row:
    every benchmark, finals only; a trained cell: :func:`trained_benchmarks`)."""
    if is_base:
        return [(b, None) for b in benchmark_specs(cfg)]
    return [(b, None) for b in trained_benchmarks(cfg)] + [(b, s) for s in snapshot_steps(cfg)
                                                           for b in curve_benchmarks(cfg)]


def data_revision(name: str, spec: "BenchmarkEval") -> str | None:
    """The dataset commit benchmark ``name`` is read at: the study's ``revision``, else the registry's pin when the
    study reads the registry's own dataset (no local ``path``, no other ``hub_id``); None = the hub's main."""
    bench = get_benchmark(name)
    if spec.revision or spec.path is not None:
        return spec.revision
    return bench.revision if spec.hub_id in (None, bench.hub_id) else None


def _hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def train_signature(cfg: "CellConfig") -> str:
    """Hash of what training depends on: the config without evaluation-only settings (only
    ``eval_every`` changes what training writes) and without runtime fields (lorarl.language.signature;
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
    own = get_benchmark(benchmark).harness is not None  # a harness's prompt is its own: the cell's template is not read
    prompt = {k: v for k, v in signature.signature_dump(cfg.prompt).items() if not (own and k == "template")}
    d: dict[str, Any] = {
        "weights": {"model": cfg.model} if is_base else train_signature(cfg),
        "benchmark": benchmark, "step": step, "seed": cfg.seed,
        "spec": {k: v for k, v in signature.signature_dump(spec).items() if k not in ("grading", "answer_format")},
        "protocol": protocol_for(benchmark, spec, cfg.eval).model_dump(mode="json"),
        "backend": cfg.eval.backend, "prompt": prompt,  # prompt.thinking only when set
        "prompt_template": get_benchmark(benchmark).template if own else template_of(cfg, benchmark == SYNTHETIC),
    }
    if benchmark == SYNTHETIC and spec.path is None:
        d["task"] = cfg.task.model_dump(mode="json")
    pin = data_revision(benchmark, spec)
    if pin and not spec.revision:  # the registry's pin: a new pin re-reads the data (the study's is in `spec`)
        d["data_revision"] = pin
    grading = cell_grading(cfg, benchmark)
    if grading != type(grading)():  # math-verify's defaults leave signatures as they were
        d["grading"] = grading.to_dict()
    return _hash(d)
