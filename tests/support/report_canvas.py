"""What a reader sees of the report's figures and page: each drawn figure kept (`capture`), the texts and legends
a figure's canvas cuts (`outside`), the figure captions (`captions`) and Python reprs in the page (`no_reprs`).
Used by tests/report/test_report.py and tests/report/test_report_canvas.py."""

from __future__ import annotations

import html
import re
from pathlib import Path


def capture(monkeypatch) -> dict:
    """Every figure the report and the aggregate save from now on, by file stem, kept for inspection."""
    from lorarl.report import draw, plots

    figs: dict[str, object] = {}
    real_save, real_plot_save = draw.save, plots._save

    def save(fig, out, table):
        figs[Path(out).stem] = fig
        return real_save(fig, out, table)

    def plot_save(fig, out):
        figs[Path(out).stem] = fig
        return real_plot_save(fig, out)

    monkeypatch.setattr(draw, "save", save)
    monkeypatch.setattr(plots, "_save", plot_save)
    return figs


def outside(fig) -> list[str]:
    """Every text and legend drawn on the figure whose window extent leaves the canvas (1 px of slack)."""
    from matplotlib.legend import Legend
    from matplotlib.text import Text

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figure's own, as it was saved (closing it detached pyplot's)
    canvas.draw()
    r = canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    shown = list(fig.texts) + list(fig.legends)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison and not ax.get_legend():
            continue
        shown += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        if ax.get_legend() is not None:
            shown.append(ax.get_legend())
        for axis in (ax.xaxis, ax.yaxis):  # the tick labels drawn: ticks within the view
            lo, hi = sorted(axis.get_view_interval())
            shown += [t.label1 for t in axis.get_major_ticks()
                      if lo - 1e-9 * abs(hi - lo) <= t.get_loc() <= hi + 1e-9 * abs(hi - lo)]
    bad = []
    for a in shown:
        if not a.get_visible() or (isinstance(a, Text) and not a.get_text().strip()):
            continue
        bb = a.get_window_extent(r)
        if bb.x0 < -1 or bb.y0 < -1 or bb.x1 > W + 1 or bb.y1 > H + 1:
            what = a.get_text() if isinstance(a, Text) else "legend" if isinstance(a, Legend) else type(a).__name__
            bad.append(f"{what[:60]!r} at [{bb.x0:.0f}, {bb.x1:.0f}] x [{bb.y0:.0f}, {bb.y1:.0f}] in {W:.0f} x {H:.0f}")
    return bad


def captions(page: str) -> list[str]:
    return [html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S)]


def no_reprs(page: str) -> list[str]:
    """Python reprs in the page's text: dicts, lists, tuples, objects."""
    text = html.unescape(re.sub(r"<style>.*?</style>", "", page, flags=re.S))
    text = re.sub("<[^>]+>", " ", text)
    return re.findall(r"\{'[^}]{0,40}|\['[^\]]{0,40}|\('[^)]{0,40}|<[a-z_.]+ object at 0x|\bBundle\(", text)
