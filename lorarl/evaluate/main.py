"""Evaluate stage: a trained cell (its final adapter or an ``eval_every`` snapshot) or a study's
``base`` pseudo-cell on its benchmarks; every sample kept, numbers logged to the cell's MLflow run.

One job evaluates the targets named by its ``--eval-target`` (``gsm8k``, ``math500@40``, comma
separated; the Snakemake rules pass it, lorarl.pipeline.jobs.jobparams), or every target of the cell without one
(``lorarl run --stages evaluate``).  Files: ``<cell>/eval/<benchmark>[@step].jsonl`` (every sample) and
``.json`` (summary), written by :mod:`lorarl.evaluate.records`.  :func:`rescore_cell` grades the
stored samples again without generating.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from lorarl import paths
from lorarl.language.evalplan.bases import base_label
from lorarl.language.evalplan.plan import (SYNTHETIC, EvalPlanError, benchmark_specs,
                                  eval_targets, format_target, cell_grading, parse_target,
                                  protocol_for)
from lorarl.language.study import Cell

BASE_RUN_FILE = "mlflow_run.json"  # <study>/<base>/: the base pseudo-cell's MLflow run, shared by its jobs

Target = tuple[str, "int | None"]


def requested_targets(cfg: Any, is_base: bool, targets: Iterable[str] | None = None) -> list[Target]:
    """The targets one job runs: ``targets`` (the job's ``--eval-target``), else all of the cell's."""
    allowed = eval_targets(cfg, is_base)
    if not targets:
        return allowed
    out = [parse_target(t) for t in targets]
    bad = [format_target(*t) for t in out if t not in allowed]
    if bad:
        raise EvalPlanError(f"evaluation target(s) {', '.join(bad)} are not planned for this cell; "
                            f"allowed: {', '.join(format_target(*t) for t in allowed)}")
    return out


def load_problems(name: str, cfg: Any) -> list:
    """A benchmark's problems as the cell's ``eval.benchmarks.<name>`` says: local file, hub
    (id/subset/revision/split) or, for ``synthetic``, the held-out split of the cell's task.

    Each problem's ``prompt`` is the cell's user message (:mod:`lorarl.tasks.prompt`, the one the
    train stage uses): math benchmarks put their question into ``prompt.template``; multiple-choice
    benchmarks keep their registry template (it lays out the choices), and so does a harness's entry
    (``Benchmark.harness``: Evalchemy's user message; the cell's system prompt and chat template apply); with ``prompt.think`` the
    registry's think variant, whose one instruction asks for <think> then the letter in \\boxed{}; under an answer-span
    format (``xml_answer``, paper 000) its span variant, the letter alone: the system prompt says where it goes."""
    from lorarl.grading.answer_formats import SPANS
    from lorarl.grading.benchmarks import CHOICE_SPAN_TEMPLATE, CHOICE_TEMPLATE, CHOICE_THINK_TEMPLATE, get_benchmark
    from lorarl.tasks.prompt import user_message

    spec = benchmark_specs(cfg)[name]
    bench = get_benchmark(name)
    if spec.hub_id or spec.subset:  # another repository is not the registry's pinned data (its own revision only)
        other = spec.hub_id not in (None, bench.hub_id)
        bench = dataclasses.replace(bench, hub_id=spec.hub_id or bench.hub_id, config=spec.subset or bench.config,
                                    **({"revision": None, "n_problems": None} if other else {}))
    fmap = dict(spec.field_map) or None
    own = bench.grader == "choice" or bench.harness is not None  # the choices' layout, or a harness's own prompt: kept
    tpl = None if own else "{question}"
    think_tpl = own and cfg.prompt.think and bench.template == CHOICE_TEMPLATE
    if think_tpl:  # one answer instruction: <think>, then the letter in \boxed{} (not the letter AND a think/boxed one)
        tpl = CHOICE_THINK_TEMPLATE
    elif own and bench.template == CHOICE_TEMPLATE and cell_grading(cfg, name).answer_format in SPANS:
        tpl = CHOICE_SPAN_TEMPLATE  # the letter without a \boxed{} request: the system prompt's format says where
    if name == SYNTHETIC and spec.path is None:
        from lorarl.tasks import task_records

        _, rows = task_records(cfg.task)
        probs = bench.load(rows=rows, field_map=fmap, limit=spec.limit, template=tpl)
    else:
        probs = bench.load(spec.path, field_map=fmap, split=spec.split, revision=spec.revision,
                           limit=spec.limit, template=tpl)
    return [dataclasses.replace(p, prompt=user_message(cfg, p.prompt, rendered=own, synthetic=name == SYNTHETIC,
                                                        add_think=False if think_tpl else None))
            for p in probs]


def weights_for(cfg: Any, results_dir: str | Path, study: str, cell_id: str, is_base: bool,
                step: int | None) -> tuple[str, Path | None]:
    """(model path, adapter path or None) of the base, the final adapter or a snapshot."""
    from lorarl.models import resolve_model

    base = resolve_model(cfg.model, results_dir)
    if is_base:
        return base, None
    kw = dict(results=results_dir, study=study, cell=cell_id)
    src = paths.path("adapter", **kw) if step is None else paths.path("snapshot", step=step, **kw)
    if not src.exists():
        what = "adapter" if step is None else f"snapshot of step {step}"
        raise FileNotFoundError(f"{what} missing at {src}: train the cell first (snapshots are saved "
                                "during training at eval.eval_every steps)")
    if (src / "adapter_config.json").exists():
        return base, src
    return str(src), None  # full fine-tuning (or a masked full update): a complete model


def make_backend(cfg: Any, model_path: str | Path, adapter: Path | None, merge_dir: Path,
                 plan: list | None = None, backend: str = "hf", targets: list | None = None) -> Any:
    """The generation backend ``backend`` (``eval.backend`` resolved: lorarl.evaluate.engines; ``vllm``: a GPU, or
    vLLM's CPU build; tests/vllm_real).

    ``plan``: every (model path, adapter) the job evaluates; the vLLM backend builds ONE engine for all of them
    (:meth:`lorarl.evaluate.vllm_backend.VLLMBackend.select` moves it on), HF one model per weight set.
    ``targets``: (prompts, protocol) of everything the job generates: vLLM's ``max_model_len`` holds the longest."""
    ev = cfg.eval
    if backend == "vllm":
        from lorarl.evaluate.vllm_backend import VLLMBackend, longest_sequence
        from lorarl.language.evalplan.lengths import sequence_tokens

        # max_model_len: the evaluation's longest sequence, the memory plan's (lorarl.memory.evaluation); without it
        # vLLM takes the model's whole context (131,072 tokens for Qwen2.5) and refuses to start where its KV pool
        # cannot hold one such sequence, on a GPU that holds what the evaluation needs. The plan charges a prompt
        # train.max_prompt_length long (else an assumed 512): a longer real prompt lengthens it, said once
        length = planned = sequence_tokens(cfg)
        need = longest_sequence(model_path, cfg.prompt, targets) if targets else 0
        if need > planned:
            length = need
            print(f"[lorarl] evaluate: the longest prompt + max_new_tokens is {need} tokens, more than the memory "
                  f"plan's {planned} (lorarl.language.evalplan.lengths.sequence_tokens): vLLM's max_model_len {need}",
                  file=sys.stderr)
        return VLLMBackend(model_path, adapter, plan=plan, merge_dir=merge_dir, seed=cfg.seed,
                           prompt_config=cfg.prompt, max_model_len=length)
    from lorarl.evaluate.backends import HFBackend

    return HFBackend(model_path, adapter, merge=True, batch_size=ev.batch_size,
                     prompt_config=cfg.prompt, generation=getattr(getattr(cfg, "runtime", None), "generation", None))


def metric_values(summary: dict) -> dict[str, float]:
    """MLflow metrics of one summary: ``eval/<benchmark>/<metric>`` (+ 95% interval bounds); MLflow
    names cannot hold '@', so ``pass@1`` is logged as ``pass_at_1``."""
    bench = summary["benchmark"]
    out: dict[str, float] = {}
    for name, m in summary["metrics"].items():
        key = f"eval/{bench}/{name.replace('@', '_at_')}"
        out[key] = m["value"]
        out[f"{key}_ci_low"] = m["ci_low"]
        out[f"{key}_ci_high"] = m["ci_high"]
    out[f"eval/{bench}/truncated_frac"] = summary["truncated_frac"]
    out[f"eval/{bench}/mean_tokens"] = summary["mean_tokens"]
    return out


def _mlflow_step(cfg: Any, is_base: bool, step: int | None) -> int:
    """Final numbers sit at the last training step (so MLflow's latest value is the final one and
    the history is the curve); the base model at step 0."""
    if step is not None:
        return step
    return 0 if is_base else cfg.train.steps


def _attach_run(tracker: Any, study: str, cell: Cell, results_dir: str | Path, is_base: bool,
                create: bool = True) -> str | None:
    """Point ``tracker`` at the cell's run: the training run of a cell, or the base pseudo-cell's
    run, created once and shared by its evaluation jobs (file lock + ``mlflow_run.json``)."""
    cdir = paths.cell_dir(results_dir, study, cell.id)
    if not is_base:
        summary = cdir / "summary.json"
        marks = sorted(cdir.glob("rungs/step-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        if summary.exists():
            tracker.run_id = json.loads(summary.read_text())["mlflow_run_id"]
        elif marks:  # a cell stopped at an adaptive study's rung (lorarl.train.until): the run its mark names
            tracker.run_id = json.loads(marks[-1].read_text()).get("mlflow_run_id")
        else:
            return None
        return tracker.run_id
    cdir.mkdir(parents=True, exist_ok=True)
    with open(cdir / f".{BASE_RUN_FILE}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        f = cdir / BASE_RUN_FILE
        if f.exists():
            info = json.loads(f.read_text())
            if info.get("model") == cell.config.model:
                try:
                    active = tracker.client.get_run(info["run_id"]).info.lifecycle_stage == "active"
                except Exception:  # noqa: BLE001 - a run from another database: make a new one
                    active = False
                if active:
                    tracker.run_id = info["run_id"]
                    return tracker.run_id
        if not create:
            return None
        labels = {k: v for k, v in cell.axes.items() if k != "model"}  # the axes telling this base apart (prompt...)
        prompt = {f"prompt.{k}": v for k, v in cell.config.prompt.model_dump(mode="json").items()}
        run_id = tracker.start(cell.id, run_name=cell.id,
                               tags={"lorarl.base": "true", "lorarl.config_hash": cell.hash,
                                     "lorarl.base_label": base_label(cell.config.model, labels),
                                     **{f"axis.{k}": str(v) for k, v in labels.items()}},
                               params={"model": cell.config.model, **prompt})
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": run_id, "model": cell.config.model}) + "\n")
        os.replace(tmp, f)
        return run_id


def log_to_mlflow(study: str, cell: Cell, results_dir: str | Path, is_base: bool,
                  summaries: Sequence[dict], create: bool = True) -> str | None:
    """Log evaluation summaries to the cell's MLflow run (each at its training step)."""
    from lorarl.tracking.client import Tracker

    if not summaries:
        return None
    tracker = Tracker(results_dir, study)
    run_id = _attach_run(tracker, study, cell, results_dir, is_base, create)
    if run_id is None:
        return None
    rows: dict[int, dict[str, float]] = {}
    for s in summaries:
        rows.setdefault(_mlflow_step(cell.config, is_base, s.get("step")), {}).update(metric_values(s))
    tracker.log_metrics([{"step": k, **v} for k, v in sorted(rows.items())])
    if is_base:
        tracker.finish()
    return run_id


def evaluate_cell(study: str, cell: Cell, results_dir: str | Path = "results", is_base: bool = False,
                  threads: int | None = None, targets: Iterable[str] | None = None) -> dict:
    """Generate, grade and record the cell's requested targets; returns {target: metrics}."""
    import torch

    from lorarl.grading.benchmarks import get_benchmark
    from lorarl.grading.pool import start_pool, wait_started
    from lorarl.evaluate.records import run_benchmark

    if threads:
        torch.set_num_threads(threads)
    cfg = cell.config
    from lorarl import ledger
    from lorarl.evaluate.engines import resolve_backend

    engine = resolve_backend(cfg.eval.backend)  # vllm where it cannot run: refused before anything is written
    wanted = requested_targets(cfg, is_base, targets)
    cdir = paths.cell_dir(results_dir, study, cell.id)
    out_dir = cdir / "eval"
    specs = benchmark_specs(cfg)
    from lorarl.evaluate.vllm_backend import warn_sampled_on_hf

    warn_sampled_on_hf(cfg)  # AIME-style n x 32k sampling with HF generate on a GPU is almost surely a mistake
    problems: dict[str, list] = {}
    summaries: list[dict] = []
    steps = list(dict.fromkeys(s for _, s in wanted))  # one model load per set of weights
    if any(get_benchmark(name).grader == "math" for name, _ in wanted):
        start_pool()  # the grading workers start beside the model load, not inside the first benchmark's grading
    weights = {step: weights_for(cfg, results_dir, study, cell.id, is_base, step) for step in steps}
    backend = None
    for step in steps:
        model_path, adapter = weights[step]
        merge_dir = cdir / ".merged" / ("final" if step is None else f"step-{step}")
        with ledger.phase("load"):  # the weights into the engine: the job's evaluation load (lorarl.ledger)
            if hasattr(backend, "select"):  # vLLM: one engine per job (a second engine fails vLLM's memory check)
                backend.select(model_path, adapter, merge_dir)
            else:
                targets = None
                if engine == "vllm":  # every target's prompts, measured before the engine fixes its max_model_len
                    for name in dict.fromkeys(n for n, _ in wanted):
                        problems[name] = load_problems(name, cfg)
                    targets = [([p.prompt for p in problems[n]], protocol_for(n, specs[n], cfg.eval)) for n in problems]
                backend = make_backend(cfg, model_path, adapter, merge_dir, plan=[weights[s] for s in steps],
                                       backend=engine, targets=targets)
                for prompts, protocol in targets or ():  # vLLM: every target fits max_model_len, before any is run
                    backend.check_budget(prompts, protocol)
        for name, s in wanted:
            if s != step:
                continue
            if name not in problems:
                problems[name] = load_problems(name, cfg)
            spec = specs[name]
            meta = {"study": study, "cell": cell.id, "model": cfg.model, "is_base": is_base,
                    "target": format_target(name, step), "config_hash": cell.hash,
                    "source": spec.model_dump(mode="json", exclude={"protocol", "grading"}),
                    "backend": engine}  # the one that ran (eval.backend auto resolves per machine)
            wait_started()  # the first time: the job's start-up (lorarl.jobclock), apart from the grading time
            summaries.append(run_benchmark(backend, get_benchmark(name), problems[name], out_dir,
                                           protocol=protocol_for(name, spec, cfg.eval), seed=cfg.seed,
                                           step=step, meta=meta, grading=cell_grading(cfg, name)))
        if not hasattr(backend, "select"):
            backend = None  # HF: free this weight set's model before the next is loaded
    log_to_mlflow(study, cell, results_dir, is_base, summaries)
    return {format_target(s["benchmark"], s["step"]): {k: m["value"] for k, m in s["metrics"].items()}
            for s in summaries}


# ----------------------------------------------------------------------------- rescore
RESCORE_DIR = "rescore"  # <cell>/eval/rescore/<target>.jsonl: the samples a re-score flipped


def rescore_file(jsonl: str | Path, *, timeout_s: float | None = None, write: bool = True,
                 grading: Any = None) -> dict:
    """Grade one stored jsonl again (no generation); with ``write`` replace samples and summary,
    and record the samples whose verdict changed in ``eval/rescore/<target>.jsonl``.

    ``grading``: the settings to grade under (default: those stored in the summary).
    """
    from lorarl.io import atomic_write_text
    from lorarl.evaluate.records import (jsonl_text, changed_verdicts,
                                         rescore_samples, write_rescored)

    jsonl = Path(jsonl)
    old = json.loads(jsonl.with_suffix(".json").read_text(encoding="utf-8"))
    samples, new_samples, new = rescore_samples(jsonl, timeout_s=timeout_s, grading=grading)
    flipped = changed_verdicts(samples, new_samples)
    if write:
        write_rescored(jsonl, samples, new_samples, new, old)
        if flipped:
            log = jsonl.parent / RESCORE_DIR / jsonl.name
            atomic_write_text(log, jsonl_text(flipped))
    new = json.loads(json.dumps(new))
    changed = sorted(k for k in set(old["metrics"]) | set(new["metrics"])
                     if old["metrics"].get(k) != new["metrics"].get(k))
    return {"file": str(jsonl), "old": old, "new": new, "identical": old == new,
            "metrics_changed": changed, "verdicts_changed": flipped}


def rescore_cell(study: str, cell: Cell, results_dir: str | Path = "results", is_base: bool = False,
                 *, timeout_s: float | None = None, write: bool = True, log: bool = True) -> list[dict]:
    """Re-score every stored evaluation of a cell under the study's grading settings; changed
    numbers are logged to its MLflow run."""
    out_dir = paths.cell_dir(results_dir, study, cell.id) / "eval"
    files = sorted(p for p in out_dir.glob("*.jsonl") if p.with_suffix(".json").exists())
    specs = benchmark_specs(cell.config)
    results = []
    for p in files:   # the study's current grading settings (a benchmark no longer listed: stored)
        name = json.loads(p.with_suffix(".json").read_text(encoding="utf-8"))["benchmark"]
        grading = cell_grading(cell.config, name) if name in specs else None
        results.append(rescore_file(p, timeout_s=timeout_s, write=write, grading=grading))
    changed = [r["new"] for r in results if r["metrics_changed"]]
    if write and log and changed:
        log_to_mlflow(study, cell, results_dir, is_base, changed, create=False)
    return results
