"""Synthetic finished results shaped like any study (no training, no model): for every cell of a loaded
study, summary.json, a short metrics.csv and every evaluation it has (final and at eval_every snapshots)
under its own protocol (samples per problem, metric names), and the base rows' evaluations. Used to feed
each published study's shape through the tables and the report (tests/report/test_report_shapes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from lorarl import paths
from lorarl.language.evalplan.plan import benchmark_specs, eval_targets, protocol_for
from lorarl.grading.protocols import summarize
from lorarl.language.study import Study, base_cells, study_cells

N_PROBLEMS = 4  # a few problems per evaluation: every table row needs them, none needs many
STEPS = 6  # metrics.csv rows per cell


def _evaluation(results: Path, study: str, cell, is_base: bool, rng: np.random.Generator) -> None:
    cfg = cell.config
    specs = benchmark_specs(cfg)
    for bench, step in eval_targets(cfg, is_base):
        proto = protocol_for(bench, specs[bench], cfg.eval)
        correct = (rng.random((N_PROBLEMS, proto.n)) < 0.5).tolist()
        kw = dict(results=results, study=study, cell=cell.id, benchmark=bench)
        samples = paths.path("eval_samples" if step is None else "eval_step_samples", **kw,
                             **({} if step is None else {"step": step}))
        samples.parent.mkdir(parents=True, exist_ok=True)
        samples.write_text("".join(json.dumps({"problem_id": f"p{i}", "sample": j, "correct": bool(c)}) + "\n"
                                   for i, row in enumerate(correct) for j, c in enumerate(row)))
        metrics = {name: {"value": m.value, "ci_low": m.ci_low, "ci_high": m.ci_high}
                   for name, m in summarize(correct, proto).items()}
        samples.with_suffix(".json").write_text(json.dumps({
            "benchmark": bench, "step": step, "primary_metric": proto.primary_metric, "n_problems": N_PROBLEMS,
            "mean_tokens": 10.0, "metrics": metrics}))


def _mask_density(cfg) -> float | None:
    """A mask cell's trained fraction of its linear layers as the fingerprint records it (stand-in value)."""
    mask = getattr(cfg.adapter, "mask", None)
    if not mask:
        return None
    return 0.5 if mask in ("principal", "nonprincipal", "low_magnitude") else 0.75


def fake_results(study: Study, results: Path, seed: int = 0, cells: list | None = None) -> Path:
    """Write the files of a finished ``study`` under ``results`` (``cells``: these cells instead of the study's,
    e.g. the seeds a hypothesis added); returns ``results``."""
    rng = np.random.default_rng(seed)
    for k, cell in enumerate(study_cells(study) if cells is None else cells):
        kw = dict(results=results, study=study.name, cell=cell.id)
        cdir = paths.path("summary", **kw).parent
        cdir.mkdir(parents=True, exist_ok=True)
        reward = np.clip(0.4 + 0.05 * np.arange(STEPS) + rng.normal(0, 0.05, STEPS), 0, 1)
        metrics = pd.DataFrame({"step": np.arange(1, STEPS + 1), "reward": reward, "accuracy": reward,
                                "grad_norm": 0.5, "kl_ref/k3": 1e-3 * np.arange(1, STEPS + 1),
                                "step_time_s": 0.2, "time/step_s": 0.19})
        if cell.config.train.beta > 0:
            metrics["kl"] = 2e-3 * np.arange(1, STEPS + 1)  # lorarl's own KL term, logged when beta > 0
        metrics.to_csv(paths.path("metrics", **kw), index=False)
        adapter: dict = {"structure": {}}
        density = _mask_density(cell.config)
        if density is not None:
            adapter["structure"]["masks"] = {"matrices": 7, "density": density}
        paths.path("summary", **kw).write_text(json.dumps({
            "study": study.name, "cell": cell.id, "config_hash": cell.hash, "mlflow_run_id": f"run{k:04d}",
            "state": "done", "steps": STEPS, "final_train_reward": float(reward[-2:].mean()),
            "wall_time_s": 10.0 + k, "mean_step_time_s": 0.2, "params_trainable": 1000 + k,
            "params_total": 100_000, "trainable_fraction": (1000 + k) / 100_000, "flags": {}, "adapter": adapter}))
        _evaluation(results, study.name, cell, False, rng)
    return fake_bases(study, results, rng)


def fake_bases(study: Study, results: Path, rng: np.random.Generator | None = None) -> Path:
    """The base rows' evaluations (the untrained model of each model and prompt)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    for b in base_cells(study):
        _evaluation(results, study.name, b, True, rng)
    return results


def settings(study: Study) -> list[dict[str, str]]:
    """The study's settings (one table row each): the non-seed axis labels of its cells, in cell order."""
    keys = [a for a in study.axes if a != study.seed_axis]
    out: list[dict[str, str]] = []
    for cell in study_cells(study):
        row = {k: str(cell.axes[k]) for k in keys}
        if row not in out:
            out.append(row)
    return out


def is_baseline(study: Study, labels: dict[str, str]) -> bool:
    """Whether a setting is a baseline row (its labels match the study's `baseline:` on every key it names)."""
    from lorarl.language.study import label_of

    return bool(study.baseline) and all(labels[k] == label_of(v) for k, v in study.baseline.items())
