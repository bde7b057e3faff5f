"""Everything the figures, tables and the report page read, from the per-cell files only.

Tolerant of partial studies: a cell without `summary.json` (not done) is left out of the tables and
figures, a missing evaluation file leaves its columns empty. Nothing here writes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lorarl import paths
from lorarl.report import readcache
from lorarl.report.rows import base_row, eval_columns, eval_curve_table, with_axes
from lorarl.language.study import Study, base_cells, study_cells

METRIC = re.compile(r"(pass|avg)@([1-9]\d*)")  # an evaluation metric's name (lorarl.report.columns.EVAL_COL)


@dataclass
class StudyData:
    study: Study
    results: Path
    cells: pd.DataFrame  # one row per finished cell: axes, summary fields, eval columns, flags
    curves: pd.DataFrame  # metrics.csv of every finished cell, axis labels attached
    base: pd.DataFrame  # base pseudo-cells' eval columns
    diag: pd.DataFrame  # diagnostics.parquet rows (long), axis labels attached
    evcurves: pd.DataFrame  # held-out metric vs step (eval_every snapshots)
    summaries: dict[str, dict] = field(default_factory=dict)  # cell id -> summary.json
    search: dict | None = None  # an adaptive study's search ledger (lorarl.report.adaptive)
    censored: pd.DataFrame = field(default_factory=pd.DataFrame)  # cells the search stopped: cell, axes, stopped_at_step

    @property
    def keys(self) -> list[str]:
        """The non-seed axes (a table row / figure series each)."""
        return [a for a in self.study.axes if a != self.study.seed_axis]

    def train_column(self, metric: str) -> str:
        """The column of a training metric in ``curves``: its name, or `train/<name>` where an axis has the
        name (lorarl.report.rows.with_axes)."""
        return f"train/{metric}" if metric in self.study.axes else metric

    def axis_by_field(self, fld: str) -> str | None:
        return next((n for n, a in self.study.axes.items() if a.field == fld), None)


def _read_json(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


_COUNTS: dict[tuple[str, str], pd.DataFrame | None] = {}  # (file, sha1 of its text) -> samples, correct


def problem_counts(results: Path, study: str, cell: str, benchmark: str) -> pd.DataFrame | None:
    """Per problem (index = problem id, sorted) of a cell's final evaluation: ``n`` samples, ``c`` correct
    (each samples file parsed once per process while unchanged: the stats table asks per group)."""
    p = paths.path("eval_samples", results=results, study=study, cell=cell, benchmark=benchmark)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    key = (str(p), hashlib.sha1(text.encode()).hexdigest())  # content, not mtime: a re-grade can rewrite
    # a file within one mtime tick
    if key not in _COUNTS:
        _COUNTS[key] = _parse_counts(text)
    return _COUNTS[key]


def _parse_counts(text: str) -> pd.DataFrame | None:
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not rows:
        return None
    df = pd.DataFrame(rows, columns=["problem_id", "correct"])
    g = df.assign(correct=df["correct"].astype(bool)).groupby(df["problem_id"].astype(str))["correct"]
    return pd.DataFrame({"n": g.size(), "c": g.sum().astype(int)}).sort_index()


def problem_scores(results: Path, study: str, cell: str, benchmark: str, metric: str) -> pd.Series | None:
    """Each problem's score under ``metric`` (index = problem id, sorted), the per-problem terms whose
    mean over problems is the cell's ``<benchmark>/<metric>`` value (:func:`score_problems`)."""
    counts = problem_counts(results, study, cell, benchmark)
    return None if counts is None else score_problems(counts, metric, f"{benchmark} of {cell}")


def score_problems(counts: pd.DataFrame, metric: str, what: str = "samples") -> pd.Series:
    """Per-problem score from ``n`` samples, ``c`` correct (papers 002 and 003: Avg@k, pass@k): ``avg@k``
    the mean correctness ``c / n``; ``pass@k`` the unbiased ``1 - C(n-c, k) / C(n, k)``
    (:func:`lorarl.grading.protocols.pass_at_k`), which is "any of the n correct" when ``k == n``."""
    from lorarl.grading.protocols import pass_at_k

    m = METRIC.fullmatch(metric)
    if m is None:
        raise ValueError(f"metric {metric!r} of {what}: allowed: avg@<k>, pass@<k> (k >= 1)")
    kind, k = m.group(1), int(m.group(2))
    n, c = counts["n"].to_numpy(dtype=int), counts["c"].to_numpy(dtype=int)
    if kind == "avg":
        return pd.Series(c / n, index=counts.index, dtype=float)
    short = counts.index[n < k]
    if len(short):
        raise ValueError(f"metric {metric!r} of {what}: {len(short)} problems have fewer than {k} samples "
                         f"(e.g. {short[0]!r} has {int(counts.at[short[0], 'n'])}); allowed: pass@k with k <= n")
    return pd.Series([pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n, c)], index=counts.index, dtype=float)


def scores_matrix(data: StudyData, cell_ids: list[str], benchmark: str,
                  metric: str) -> tuple[np.ndarray, list[str]] | None:
    """[S, P] per-problem ``metric`` scores of some cells on the problems they all have, or None."""
    series = [problem_scores(data.results, data.study.name, c, benchmark, metric) for c in cell_ids]
    if not series or any(s is None for s in series):
        return None
    common = sorted(set.intersection(*(set(s.index) for s in series)))
    if not common:
        return None
    return np.stack([s.loc[common].to_numpy(dtype=float) for s in series]), common


def load(study: Study, results: str | Path = "results") -> StudyData:
    from lorarl.report.adaptive import censored_rows, report_cells, search_ledger
    from lorarl.language.study import cell_table

    results = Path(results)
    rows, frames, summaries = [], [], {}
    cells = report_cells(study, cell_table(study), results)  # + the seeds a hypothesis added
    for cell in cells:
        kw = dict(results=results, study=study.name, cell=cell.id)
        s = _read_json(paths.path("summary", **kw))
        if s is None:
            continue
        summaries[cell.id] = s
        row = {"cell": cell.id, **cell.axes, "state": s.get("state", "done"),
               **{k: s.get(k) for k in ("final_train_reward", "wall_time_s", "mean_step_time_s",
                                        "trainable_fraction", "params_trainable", "params_total")}}
        for name, step in (s.get("flags") or {}).items():
            row[f"flag/{name}"] = step
        try:
            row.update(eval_columns(results, study.name, cell.id, cell.config))
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass  # evaluation not finished yet: its columns stay empty
        rows.append(row)
        m = paths.path("metrics", **kw)
        if m.exists():
            frames.append(with_axes(readcache.read_csv(m), cell))
    base_rows = []
    for b in base_cells(study):
        try:
            base_rows.append({**base_row(b), **eval_columns(results, study.name, b.id, b.config, is_base=True)})
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            continue
    diag = []
    for cell in cells:
        p = paths.path("diagnostics", results=results, study=study.name, cell=cell.id)
        if p.exists() and cell.id in summaries:
            diag.append(readcache.read_parquet(p).assign(cell=cell.id, **cell.axes))
    try:
        evc = eval_curve_table(study, results)
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        evc = pd.DataFrame()
    return StudyData(study, results, pd.DataFrame(rows), pd.concat(frames, ignore_index=True) if frames
                     else pd.DataFrame(), pd.DataFrame(base_rows),
                     pd.concat(diag, ignore_index=True) if diag else pd.DataFrame(), evc, summaries,
                     search_ledger(study, results), pd.DataFrame(censored_rows(study, cell_table(study), results)))
