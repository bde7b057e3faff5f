"""`lorarl doctor <study>`: smoke-test one cell on the study's own launcher/profile, project the study's cost.

Login side (:func:`doctor`): writes a one-cell smoke study (the chosen cell, ``--steps`` optimiser steps, each benchmark
limited to ``--eval-limit`` problems, no snapshots) under ``results/<study>/doctor/``, builds a missing ``local:`` base
model first, and submits the ``doctor`` stage through :func:`lorarl.pipeline.jobs.launch.launch` with the profile's launcher
and the ``train`` stage's Slurm resources (so on a cluster it runs on the real GPU partition). In the job
(:func:`doctor_job`) the checks run before anything long: rollout engine, model + tokenizer, training data, reward
regime (teacher/PRM tokenizer checks), evaluation problems, the memory of every evaluation job of the study on this
device (the KV cache of its longest budget, lorarl.memory.evaluation: on a GPU one that does not fit fails, naming the
knob); then the smoke training (through the real train stage), the evaluation of each benchmark (timed; the base model's
first problem alone first, so the timed evaluation is warm), and the weight diagnostics; the job also records its own
clock (its process's age at entry, the libraries' import, each part's wall and CPU seconds) and samples the machine's
load (lorarl.pipeline.doctor.clock). Back on the login side (lorarl.pipeline.doctor.report) a fresh launcher, a fresh
aggregation of the smoke study and a Snakemake dry run of the study are timed, and the measurements become a projection
of every job the study runs, each with its start-up (lorarl.pipeline.doctor.projection), with its assumptions, written
as ``doctor.json`` and ``doctor.md``. Exit status: 0 all checks pass, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

from lorarl.jobclock import process_age_s
from lorarl.pipeline.doctor.clock import LoadSampler, Timer
from lorarl.language.study import base_cells, find_cell, load_study

HEADROOM = 0.90  # peak memory above this share of the device's total fails the headroom check
STACK = ("torch", "transformers", "peft", "mlflow")  # what every model job (train, evaluate, diagnose) imports
REQUEST = "doctor_request.json"  # next to the smoke study: what the job measures
MEASURED = "measurements.json"  # written by the job into the smoke results folder


# ----------------------------------------------------------------------------- in the job
def device_info() -> dict[str, Any]:
    import os
    import subprocess

    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            driver = "unknown"
        return {"kind": "cuda", "name": props.name, "count": torch.cuda.device_count(), "driver": driver,
                "cuda": torch.version.cuda, "memory_gb": props.total_memory / 2**30, "torch": torch.__version__}
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"kind": "cpu", "name": platform.processor() or platform.machine(), "count": os.cpu_count(),
            "driver": "n/a", "cuda": None, "memory_gb": mem, "torch": torch.__version__}


def _peak_memory_gb() -> float:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def job_info() -> dict[str, Any]:
    """Where this job runs, as the job itself sees it (host; Slurm job id, partition, nodes, GPUs)."""
    import socket

    from lorarl.provenance import slurm_env

    return {"host": socket.gethostname(), **slurm_env()}


def tracking_check(results_dir: str) -> str:
    """The job reaches the profile's MLflow store (a server URI must answer from the compute node)."""
    from mlflow import MlflowClient

    from lorarl.tracking.client import is_server, resolve_tracking

    uri = resolve_tracking(None, results_dir)
    if is_server(uri):
        from lorarl.tracking.credentials import configure_client

        configure_client(uri)
    else:  # a new sqlite store is made whole or not at all, under the lock the cells use
        from lorarl.tracking import sqlite_store
        from lorarl.tracking.client import locked

        with locked(results_dir):
            sqlite_store.ensure(uri)
    MlflowClient(uri).search_experiments(max_results=1)
    return uri


class _Checks:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.phases: dict[str, dict[str, float]] = {}  # what a study's jobs repeat: wall and CPU seconds

    def run(self, name: str, fn: Any, phase: str | None = None) -> Any:
        with Timer() as t:
            try:
                out, err = fn(), None
            except Exception as e:  # noqa: BLE001 - a failed check is reported, not raised
                out, err = None, e
        if phase:
            self.phases[phase] = t.as_dict()
        if err is not None:
            self.rows.append({"check": name, "ok": False, "detail": f"{type(err).__name__}: {err}"[:500],
                              "seconds": round(t.wall, 3)})
            return None
        detail = out if isinstance(out, str) else ""
        self.rows.append({"check": name, "ok": True, "detail": detail, "seconds": round(t.wall, 3)})
        return out

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)


def _num(row: dict[str, str], key: str) -> float | None:
    v = row.get(key)
    if v in (None, ""):
        return None
    x = float(v)
    return None if math.isnan(x) else x


def _mean(rows: list[dict[str, str]], key: str) -> float:
    vals = [x for x in (_num(r, key) for r in rows) if x is not None]
    return sum(vals) / len(vals) if vals else 0.0


def _updates_of(row: dict[str, str]) -> float:
    """Optimiser updates per training step of a metrics row (1 without an ``update`` column)."""
    u, s = _num(row, "update"), _num(row, "step")
    return u / s if u and s else 1.0


def truncation(metrics_csv: Path, cap: int) -> dict:
    """The share of the smoke's own completions that reached ``max_completion_length`` without an end (every
    logged step, the warm-up one too: the trainer's ``frac_truncated``, TRL's ``completions/clipped_ratio``)."""
    with open(metrics_csv) as fh:
        vals = [x for x in (_num(r, "frac_truncated") for r in csv.DictReader(fh)) if x is not None]
    share = sum(vals) / len(vals) if vals else None
    detail = (f"{share:.0%} of the smoke's completions ({len(vals)} step(s)) reached max_completion_length {cap} "
              "without an end" if share is not None else "not measured (no frac_truncated in metrics.csv)")
    if share is not None and share >= 0.5:
        detail += ": most answers are cut, and with them a reward paid at the end (an answer tag)"
    return {"share": share, "steps": len(vals), "cap": cap, "detail": detail}


def step_split(metrics_csv: Path) -> dict[str, float]:
    """Mean seconds per optimiser step by part (the first step is warm-up: dropped when later steps generate).

    The trainer logs one value per generation round and TRL averages a step's values: with DAPO refills
    (``dynamic_sampling/rounds`` > 1) a step's generation, reward and scoring cost is the logged value x its
    rounds. With PPO mini-batches a metrics row is one training step of ``update / step`` optimiser updates
    (lorarl.train.callbacks) that generated once: per-update parts divide by the updates the rows cover.
    """
    with open(metrics_csv) as fh:
        rows = list(csv.DictReader(fh))
    if len(rows) > 1 and any(_num(r, "time/generate_s") is not None for r in rows[1:]):
        rows = rows[1:]
    n = max(sum(_updates_of(r) for r in rows), 1)  # optimiser updates the rows cover

    def per_step(key: str) -> float:  # a generating step's value x its rounds, 0 on steps without a rollout
        total = 0.0
        for r in rows:
            v = _num(r, key)
            if v is not None:
                total += v * (_num(r, "dynamic_sampling/rounds") or 1.0)
        return total / n

    gen_rows = [r for r in rows if _num(r, "time/generate_s") is not None]
    rounds = sum(_num(r, "dynamic_sampling/rounds") or 1.0 for r in gen_rows)
    step, score, gen = _mean(rows, "time/step_s"), per_step("time/score_s"), per_step("time/generate_s")
    reward, tokens = per_step("time/reward_s"), per_step("rollout/tokens")
    ref = sum(_num(r, "time/ref_forward_s") or 0.0 for r in rows) / n
    monitors = _mean(rows, "time/kl_monitor_s") + _mean(rows, "time/kl_new_old_s")
    degenerate = [x for x in (_num(r, "rollout/degenerate_rate") for r in rows) if x is not None]
    return {
        "rollout_generation_s": gen,
        "reward_s": reward,
        "reference_forward_s": ref,
        "old_policy_forward_and_advantages_s": max(score - gen - reward, 0.0),
        "policy_forward_backward_s": max(step - score - ref, 0.0),
        "kl_monitor_per_run_s": monitors,  # every kl_monitor_every steps, outside the step
        "step_s": step,
        "scoring_s": score,  # generation + reward + old-policy forward, every round of the step
        "generation_rounds_per_step": rounds / n,  # DAPO refills (x mini-batch share of generating steps)
        "rollout_tokens_per_step": tokens,
        "rollout_tokens_per_s": tokens / gen if gen > 0 else 0.0,
        # share of sampled prompt groups whose rewards were all equal (DAPO drops and refills those)
        "degenerate_rate": sum(degenerate) / len(degenerate) if degenerate else None,
        "freshness_logp_diff_max": max([float(r["rollout/logp_diff_mean"]) for r in rows
                                        if r.get("rollout/logp_diff_mean")] or [float("nan")]),
    }


def doctor_job(study_path: str, cell_id: str, results_dir: str, threads: int | None = None) -> dict:
    """The doctor stage (what the submitted job runs): checks, smoke training, evaluation, diagnostics; the
    job's own clock (process start, entry, end: the projection's per-job start-up) and the machine's load."""
    age, entry = process_age_s(), time.time()  # the interpreter, submitit, the launcher's modules
    with LoadSampler() as load:
        out = _smoke(study_path, cell_id, results_dir, threads)
    out["clock"] = {"proc_s": age, "process_start_epoch": entry - age if age is not None else None,
                    "entry_epoch": entry, "end_epoch": time.time(), "cpu_s": time.process_time()}
    out["load"] = load.summary()
    return _write(results_dir, out)


def _one_problem(cell: Any, name: str) -> Any:
    """The cell with benchmark ``name`` limited to its first problem."""
    import dataclasses

    ev = cell.config.eval
    benches = {**ev.benchmarks, name: ev.benchmarks[name].model_copy(update={"limit": 1})}
    cfg = cell.config.model_copy(update={"eval": ev.model_copy(update={"benchmarks": benches})})
    return dataclasses.replace(cell, config=cfg)


def _smoke(study_path: str, cell_id: str, results_dir: str, threads: int | None) -> dict:
    """The checks and the smoke run; ``phases``: wall and CPU seconds of each part a study's jobs repeat."""
    import importlib
    with Timer() as stack:  # first thing, as in every model job: the libraries' and the stages' imports
        for name in STACK:
            importlib.import_module(name)
        import torch

        from lorarl.diagnose.main import diagnose_cell
        from lorarl.language.evalplan.plan import benchmark_specs, trained_benchmarks
        from lorarl.evaluate.main import evaluate_cell, load_problems
        from lorarl.memory.auto import resolve_job, world_size
        from lorarl.models import resolve_model
        from lorarl.rewards.registry import build_regime
        from lorarl.train.rollout import check_engine
        from lorarl.tasks import task_records
        from lorarl.train.main import train_cell
        from lorarl.train.prepare import load_policy

    if threads:
        torch.set_num_threads(threads)
    request = json.loads((Path(study_path).parent / REQUEST).read_text())
    study = load_study(study_path)
    cell = find_cell(study, cell_id)
    cfg = cell.config
    checks = _Checks()
    checks.phases["stack"] = stack.as_dict()
    dev = device_info()
    device = "cuda" if dev["kind"] == "cuda" else "cpu"
    out: dict[str, Any] = {"device": dev, "cell": cell.id, "steps": cfg.train.steps, "job": job_info(),
                           "train_ranks": world_size()}

    with Timer() as opened:  # what every job pays to open the study's store (sqlite: the schema check's imports)
        try:
            from lorarl.tracking.client import is_server, resolve_tracking

            if not is_server(resolve_tracking(None, results_dir)):
                from lorarl.tracking.sqlite_store import head_revision

                head_revision()
        except Exception:  # noqa: BLE001 - the MLflow check below reports what is wrong
            pass
    checks.phases["mlflow_open"] = opened.as_dict()
    checks.run("MLflow store", lambda: tracking_check(results_dir), phase="mlflow")  # the smoke's: created once
    checks.run("rollout engine", lambda: check_engine(cfg.rollout) or f"{cfg.rollout.engine} works here",
               phase="rollout")
    loaded = checks.run("model and tokenizer load", lambda: load_policy(cfg, results_dir, device), phase="first_load")
    if loaded is not None:
        del loaded
        with Timer() as warm:  # again, warm: what every later job pays (the first load also imported the stack)
            model, tok = load_policy(cfg, results_dir, device)
        out["model_load_s"], checks.phases["model_load"] = warm.wall, warm.as_dict()
        out["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        out["params"] = sum(p.numel() for p in model.parameters())
        checks.rows[-1]["detail"] = (f"{out['params']:,} parameters in {out['dtype']}, "
                                     f"{out['model_load_s']:.2f}s per load")

        def tokenizer_check() -> str:
            text = "Q: 12+34=?"
            if tok.eos_token_id is None:
                raise ValueError("the tokenizer has no EOS token: rollouts would never stop")
            back = tok.decode(tok(text, add_special_tokens=False)["input_ids"])
            if back.strip() != text:
                raise ValueError(f"tokenizer round trip changed {text!r} into {back!r}")
            return f"vocab {len(tok)}, eos {tok.eos_token!r}"

        checks.run("tokenizer", tokenizer_check)
        checks.run("reward regime (teacher/PRM checks)", lambda: f"{build_regime(cfg.reward, tok, resolve=lambda name: resolve_model(name, results_dir), device=device, temperature=cfg.train.temperature).name} builds",
                   phase="regime")
        del model
    checks.run("training data loads", lambda: f"{len(task_records(cfg.task)[0])} training prompts", phase="train_data")

    def prompt_lengths() -> str:  # of every cell of the study (the projection scales steps by them)
        from lorarl.pipeline.doctor.projection import prompt_tokens_by_cell

        out["prompt_tokens"], out["prompt_tokens_notes"] = prompt_tokens_by_cell(request["study"], request["results"])
        mine = out["prompt_tokens"].get(cell.id)
        if mine is None:
            raise ValueError("; ".join(out["prompt_tokens_notes"]) or "the smoke cell's prompts were not measured")
        vals = out["prompt_tokens"].values()
        return (f"this cell {mine:.1f} tokens per prompt; the study's cells {min(vals):.1f}-{max(vals):.1f}"
                + (f" ({len(out['prompt_tokens_notes'])} not measured)" if out["prompt_tokens_notes"] else ""))

    checks.run("training prompt lengths", prompt_lengths)

    def eval_backend() -> str:
        from lorarl.evaluate.vllm_backend import sampled_on_hf

        heavy = sampled_on_hf(cfg) if device == "cuda" else []
        if heavy:  # not a failure: a loud note in the table (the evaluation jobs print a banner too)
            return "WARNING sampled protocols with eval.backend hf on a GPU: " + "; ".join(heavy)
        from lorarl.evaluate.engines import resolve_backend

        ran = resolve_backend(cfg.eval.backend)  # vllm where it cannot run: this check fails, naming why
        return f"eval.backend {cfg.eval.backend}" + (f" (runs {ran} here)" if ran != cfg.eval.backend else "")

    checks.run("evaluation backend", eval_backend)

    def eval_memory() -> str:  # every evaluation job's generation at its longest budget (the KV cache of 32k tokens)
        from lorarl.memory.evaluation import device_eval_check

        out["eval_memory_plan"], line = device_eval_check(request["study"], device, dev["memory_gb"], request["results"])
        return line

    checks.run("evaluation memory", eval_memory)
    for name in benchmark_specs(cfg):
        checks.run(f"evaluation data: {name}", lambda name=name: f"{len(load_problems(name, cfg))} problems (smoke limit)",
                   phase=f"eval_data:{name}")
    out["phases"] = checks.phases
    if not checks.ok:  # nothing long starts when a check fails
        out.update(checks=checks.rows, ok=False)
        return out

    summary = checks.run("smoke training", lambda: train_cell(
        study.name, cell, results_dir, threads=threads,
        config=resolve_job(cfg, results_dir=str(results_dir))) and f"{cfg.train.steps} steps", phase="train")
    out["train_wall_s"] = checks.phases["train"]["wall_s"]
    cdir = Path(results_dir) / study.name / cell.id
    if summary is not None:
        out["split"] = step_split(cdir / "metrics.csv")
        out["truncation"] = truncation(cdir / "metrics.csv", cfg.train.max_completion_length)
        checks.rows.append({"check": "completions cut at the cap", "ok": True, "seconds": 0.0,
                            "detail": out["truncation"]["detail"]})  # shown, never fatal: a tiny smoke model rambles
        done = json.loads((cdir / "summary.json").read_text())  # what training actually ran with
        out["precision"], out["trainable_dtypes"] = done.get("precision"), done.get("trainable_dtypes")
        if cfg.rollout.engine == "vllm":
            worst = out["split"]["freshness_logp_diff_max"]
            checks.rows.append({"check": "rollout freshness gate", "ok": worst <= cfg.rollout.freshness_threshold,
                                "detail": f"max mean |logp diff| {worst:.4g} (threshold {cfg.rollout.freshness_threshold})",
                                "seconds": 0.0})
        else:
            checks.rows.append({"check": "rollout freshness gate", "ok": True, "seconds": 0.0,
                                "detail": "n/a: engine hf samples from the trained policy itself"})
        out["evaluation"] = {}
        (base,) = [b for b in base_cells(study)]  # the smoke study's untrained model (the aggregation needs it)
        for i, name in enumerate(benchmark_specs(cfg)):
            # its first problem first: what an evaluation job pays once (lazy imports, MLflow); later ones warm
            checks.run(f"evaluation of the base model (1 problem): {name}", lambda name=name: evaluate_cell(
                study.name, _one_problem(base, name), results_dir, is_base=True, threads=threads, targets=[name])
                and "ok", phase="eval_first" if i == 0 else None)
            who = cell if name in trained_benchmarks(cfg) else base  # measured before training: on the base only
            got = checks.run(f"evaluation: {name}", lambda name=name, who=who: evaluate_cell(
                study.name, who, results_dir, is_base=who is base, threads=threads, targets=[name])
                and f"{cfg.eval.backend} backend", phase=f"eval:{name}")
            wall = checks.phases[f"eval:{name}"]["wall_s"]
            sfile = Path(results_dir) / study.name / who.id / "eval" / f"{name}.json"
            if got is not None and sfile.exists():
                s = json.loads(sfile.read_text())
                gen_s = max(wall - out["model_load_s"], 0.1 * wall)  # generation + grading, without the load
                out["evaluation"][name] = {
                    "wall_s": wall, "problems": s["n_problems"], "samples": s["n_samples"],
                    "seconds_per_problem": gen_s / max(s["n_problems"], 1),
                    "tokens_per_s": s["n_samples"] * s["mean_tokens"] / gen_s}
        checks.run("weight diagnostics", lambda: diagnose_cell(study.name, cell, results_dir, threads=threads) and "ok",
                   phase="diagnose")
        out["diagnose_s"] = checks.phases["diagnose"]["wall_s"]
    out["peak_memory_gb"] = _peak_memory_gb()
    from lorarl.memory.cells import device_projection  # the plan's figure beside the measured one

    out["memory_plan"] = device_projection(cfg, dev["kind"], dev["memory_gb"], int(dev["count"] or 1), results_dir)
    share = out["peak_memory_gb"] / dev["memory_gb"] if dev["memory_gb"] else 0.0
    checks.rows.append({"check": "memory headroom", "ok": share <= HEADROOM, "seconds": 0.0,
                        "detail": f"peak {out['peak_memory_gb']:.2f} of {dev['memory_gb']:.1f} GiB ({share:.0%}; "
                                  f"limit {HEADROOM:.0%})"})
    out.update(checks=checks.rows, ok=checks.ok, request=request)
    return out


def _write(results_dir: str, out: dict) -> dict:
    path = Path(results_dir) / MEASURED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    return {"ok": out.get("ok", False), "measurements": str(path)}
