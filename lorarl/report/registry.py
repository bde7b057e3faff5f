"""The figure registry: each figure family declares what it needs and draws only when the study has it.

A need is a string checked against the study's data (`has`):

* ``axis:<field>``: an axis sets that config field (e.g. ``axis:adapter.rank``);
* ``curve:<metric>``: a per-step training metric with at least one value (metrics.csv);
* ``cell:<column>``: a per-cell value (summary.json or an evaluation column, e.g. ``cell:trainable_fraction``);
* ``eval``: at least one held-out benchmark column; ``evcurve``: held-out metric at snapshots;
* ``diag:<metric>``: a weight-space diagnostic (diagnostics.parquet);
* ``fullft:<field>``: that axis has a full fine-tuning value (a bundle setting adapter.method: full) with a row;
* ``search``: an adaptive study's search has decided a rung (its ledger, docs/adaptive.md);
* ``a|b``: any of the alternatives.

Every drawn PNG gets the CSV of exactly what it draws beside it (same stem).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lorarl.report.data import StudyData


@dataclass(frozen=True)
class FigureSpec:
    name: str  # file stem under results/<study>/figures/
    paper: str  # which headline figure it reproduces, e.g. "001 Fig. 4"
    needs: tuple[str, ...]  # requirements (see module doc)
    caption: str  # shown under the figure in the report; `{name}` fields are filled by `caption_vars`
    draw: Callable[[StudyData, Path], Path | None]  # (data, png path) -> the png, or None if nothing to draw
    caption_vars: Callable[[StudyData], dict] | None = None  # what the caption says that depends on the study

    def caption_for(self, data: StudyData | None) -> str:
        """The caption with its study-dependent fields (e.g. the real averaging window) filled in."""
        if self.caption_vars is None:
            return self.caption
        return self.caption.format(**self.caption_vars(data)) if data is not None else self.caption


REGISTRY: dict[str, FigureSpec] = {}


def register(name: str, paper: str, needs: tuple[str, ...], caption: str,
             caption_vars: Callable[[StudyData], dict] | None = None):
    def deco(fn: Callable[[StudyData, Path], Path | None]):
        if name in REGISTRY:
            raise ValueError(f"figure {name!r} registered twice")
        REGISTRY[name] = FigureSpec(name, paper, needs, caption, fn, caption_vars)
        return fn
    return deco


def _has_one(data: StudyData, need: str) -> bool:
    kind, _, arg = need.partition(":")
    if kind == "axis":
        return data.axis_by_field(arg) is not None
    if kind == "curve":
        arg = data.train_column(arg)  # a metric named like an axis lives at train/<name>
        return not data.curves.empty and arg in data.curves and data.curves[arg].notna().any()
    if kind == "cell":
        return not data.cells.empty and arg in data.cells and data.cells[arg].notna().any()
    if kind == "eval":
        from lorarl.report.tables import primary_metrics

        return bool(primary_metrics(data))
    if kind == "fullft":  # a full fine-tuning value on the `arg` axis, with a row in the cells table
        from lorarl.report.draw import full_label

        axis = data.axis_by_field(arg)
        full = full_label(data, axis) if axis else None
        return full is not None and not data.cells.empty and axis in data.cells and bool((data.cells[axis] == full).any())
    if kind == "evcurve":
        return not data.evcurves.empty
    if kind == "diag":
        return not data.diag.empty and (data.diag["metric"] == arg).any()
    if kind == "search":  # an adaptive study's search decided at least one rung (lorarl.report.adaptive)
        return bool(data.search and any(r.get("decided") for r in data.search.get("rungs", [])))
    raise ValueError(f"unknown figure need {need!r}; allowed kinds: axis, curve, cell, eval, evcurve, diag, fullft, "
                     f"search")


def has(data: StudyData, need: str) -> bool:
    return any(_has_one(data, alt) for alt in need.split("|"))


def missing(spec: FigureSpec, data: StudyData) -> list[str]:
    return [n for n in spec.needs if not has(data, n)]
