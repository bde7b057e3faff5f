"""Rows read from one study's results: a cell's final-evaluation columns, a base pseudo-cell's
identifying columns, the held-out curve table. The bottom of the report's one-way imports: the
aggregate stage and `lorarl.report.data` read through these; figures, tables and html sit above."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from lorarl import paths
from lorarl.language.evalplan.bases import base_label
from lorarl.language.evalplan.plan import curve_benchmarks, eval_targets, snapshot_steps
from lorarl.language.study import Study, study_cells


def _read_json(p: Path) -> dict:
    return json.loads(p.read_text())


def eval_columns(results: str | Path, study: str, cell: str, cfg, is_base: bool = False) -> dict:
    """`<benchmark>/<metric>` values of a cell's final evaluations, plus the one-seed 95% interval
    (`_ci_low`, `_ci_high`) and the number of problems of each benchmark."""
    row: dict = {}
    for bench, step in eval_targets(cfg, is_base):
        if step is not None:
            continue
        ev = _read_json(paths.path("eval_summary", results=results, study=study, cell=cell, benchmark=bench))
        for name, m in ev["metrics"].items():
            row[f"{bench}/{name}"] = m["value"]
            row[f"{bench}/{name}_ci_low"], row[f"{bench}/{name}_ci_high"] = m["ci_low"], m["ci_high"]
        row[f"{bench}/n_problems"] = ev["n_problems"]
    return row


def base_row(b) -> dict:
    """The identifying columns of a base pseudo-cell's row: id, model, the axis labels of its
    prompt (lorarl.language.evalplan.bases: one base per model and evaluation setting) and its table label."""
    return {"cell": b.id, "model": b.config.model, **{k: v for k, v in b.axes.items() if k != "model"},
            "base": base_label(b.config.model, b.axes)}


def with_axes(metrics: pd.DataFrame, cell) -> pd.DataFrame:
    """A cell's per-step metrics (metrics.csv) with its id and axis labels attached. A metric named like an
    axis (lorarl's own `kl` term beside paper 000's `kl` axis) moves to `train/<name>` first, so the axis
    label never overwrites its values (`StudyData.train_column` finds it)."""
    clash = {c: f"train/{c}" for c in metrics.columns if c in cell.axes}
    return metrics.rename(columns=clash).assign(cell=cell.id, **cell.axes)


def eval_curve_table(study: Study, results: str | Path) -> pd.DataFrame:
    """Held-out primary metric vs training step (eval.eval_every snapshots + the final adapter),
    one row per cell x curve benchmark x step; empty when no cell saves snapshots."""
    from lorarl.report.adaptive import censored, report_cells
    from lorarl.language.study import cell_table

    rows = []
    table = cell_table(study)
    stopped = censored(study, table, results)  # a censored cell's curve ends at its rung
    for cell in report_cells(study, table, results):
        steps = snapshot_steps(cell.config)
        if not steps:
            continue
        kw = dict(results=results, study=study.name, cell=cell.id)
        for bench in curve_benchmarks(cell.config):
            files = [(st, paths.path("eval_step_summary", benchmark=bench, step=st, **kw)) for st in steps
                     if st <= stopped.get(cell.id, st)]
            if cell.id not in stopped:
                files.append((cell.config.train.steps, paths.path("eval_summary", benchmark=bench, **kw)))
            for st, f in files:
                ev = _read_json(f)
                metric = _headline(cell.config, bench) or ev["primary_metric"]
                m = ev["metrics"][metric]
                rows.append({"cell": cell.id, **cell.axes, "benchmark": bench, "metric": metric,
                             "step": st, "value": m["value"], "ci_low": m["ci_low"], "ci_high": m["ci_high"]})
    return pd.DataFrame(rows)


def _headline(cfg: Any, bench: str) -> str | None:
    """The study's headline metric of ``bench`` (``eval.benchmarks.<b>.headline``), if it names one."""
    spec = (cfg.eval.benchmarks or {}).get(bench)
    return spec.headline if spec is not None else None
