"""Which columns of a cell table are evaluation values, and each benchmark's headline column."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

EVAL_COL = re.compile(r"^[A-Za-z0-9_]+/(pass|avg)@\d+$")  # `<benchmark>/<metric>` value columns


def eval_metrics(df: pd.DataFrame) -> list[str]:
    """The evaluation value columns of a table, in column order."""
    return [c for c in df.columns if EVAL_COL.match(str(c))]


def primary_columns(df: pd.DataFrame, headlines: dict[str, str] | None = None) -> list[str]:
    """Each benchmark's headline column: the metric the study names (``eval.benchmarks.<b>.headline``, see
    :func:`headlines`), else its first metric (pass@1, or avg@n for sampled protocols)."""
    first: dict[str, str] = {}
    for c in eval_metrics(df):
        first.setdefault(c.split("/")[0], c)
    for bench, metric in (headlines or {}).items():
        if bench in first and f"{bench}/{metric}" in df.columns:
            first[bench] = f"{bench}/{metric}"
    return list(first.values())


def headlines(study: Any) -> dict[str, str]:
    """Benchmark -> the headline metric a study names for it (``eval.benchmarks.<b>.headline``)."""
    from lorarl.language.study import study_cells

    out: dict[str, str] = {}
    for cell in study_cells(study):
        ev = getattr(cell.config, "eval", None)  # a toy cell has no evaluation
        for bench, spec in ((ev.benchmarks or {}) if ev is not None else {}).items():
            if spec.headline:
                out.setdefault(bench, spec.headline)
    return out


def is_baseline_row(study: Any, labels: dict) -> bool:
    """Whether a row with these axis labels is a baseline row: it takes the study's `baseline:` label on every
    axis the baseline names (one baseline row per setting of the other axes)."""
    from lorarl.language.study import label_of

    base = getattr(study, "baseline", None)
    return bool(base) and all(str(labels.get(k)) == label_of(v) for k, v in base.items())


def baseline_text(baseline: dict) -> str:
    """The study's baseline setting as a reader writes it (`kl = 0.05, method = lora`), never a Python dict."""
    return ", ".join(f"{k} = {v}" for k, v in baseline.items())
