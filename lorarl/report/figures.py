"""Every figure of the report: one module per figure family (`fig_<family>.py` in this package)
registers its figures with `lorarl.report.registry.register`; adding a family is adding one module.
`draw_all` draws each figure whose needs the study meets (`lorarl.report.registry.missing`).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from lorarl.report.data import StudyData
from lorarl.report.registry import REGISTRY, FigureSpec, missing

FAMILY_PREFIX = "fig_"  # modules of this package that register figures


def load_all() -> dict[str, FigureSpec]:
    """Import every figure family: each `fig_*.py` module of this package registers its figures."""
    for mod in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if mod.name.startswith(FAMILY_PREFIX):
            importlib.import_module(f"lorarl.report.{mod.name}")
    return REGISTRY


def draw_all(data: StudyData, fdir: Path) -> tuple[dict[str, Path], dict[str, list[str]]]:
    """Draw every registered figure the study can have; returns (drawn, skipped: name -> missing needs)."""
    fdir.mkdir(parents=True, exist_ok=True)
    from lorarl.report.draw import reset_palette

    reset_palette(data.study)  # one colour per group in every figure (the aggregate stage's too)
    drawn, skipped = {}, {}
    for name, spec in load_all().items():
        miss = missing(spec, data)
        if miss:
            skipped[name] = miss
            continue
        try:
            out = spec.draw(data, fdir / f"{name}.png")
        except Exception as err:  # one broken figure never costs the tables, the page or the others
            print(f"[lorarl report] figure {name} failed: {type(err).__name__}: {err}", file=sys.stderr)
            skipped[name] = [f"error: {type(err).__name__}: {err}"]
            continue
        if out is not None:
            drawn[name] = out
        else:
            skipped[name] = ["nothing to draw"]
    return drawn, skipped
