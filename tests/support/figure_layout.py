"""Text that overlaps in a drawn matplotlib figure: titles, axis labels and the drawn tick labels of every
visible axes, and the figure's suptitle. Two texts of the same axes may touch (a tick label and its own axis
label are laid out by matplotlib); a title may overlap nothing, and nothing may overlap across axes. A legend
may lie on its own axes' plot area, never on another's nor on a text."""

from __future__ import annotations

import itertools


def _texts(fig) -> list[tuple[str, int | None, object]]:
    out: list[tuple[str, int | None, object]] = []
    if fig._suptitle is not None and fig._suptitle.get_text():
        out.append(("suptitle", None, fig._suptitle))
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        for t in (ax.title, ax._left_title, ax._right_title):
            if t.get_text():
                out.append(("title", i, t))
        for t in (ax.xaxis.label, ax.yaxis.label):
            if t.get_text():
                out.append(("label", i, t))
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():  # the ticks drawn (inside the view interval)
                for t in (tick.label1, tick.label2):
                    if t.get_visible() and t.get_text():
                        out.append(("tick", i, t))
    return out


def _legends(fig) -> list[tuple[str, int | None, object]]:
    out = [("legend", None, lg) for lg in fig.legends]
    for i, ax in enumerate(fig.axes):
        if ax.get_visible() and ax.get_legend() is not None:
            out.append(("legend", i, ax.get_legend()))
    return out


def _twins(fig, i: int | None, j: int | None) -> bool:
    """Two axes drawn on one plot area (twinx)."""
    if i is None or j is None:
        return False
    a, b = fig.axes[i].get_position(), fig.axes[j].get_position()
    return bool(abs(a.x0 - b.x0) < 1e-9 and abs(a.y0 - b.y0) < 1e-9 and abs(a.width - b.width) < 1e-9
                and abs(a.height - b.height) < 1e-9)


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of texts whose drawn boxes intersect (see the module doc), and legends drawn over another axes'
    plot area or over a text, as (what, what)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [(kind, i, t.get_text(), t.get_window_extent(r)) for kind, i, t in _texts(fig)]
    boxes += [(kind, i, "legend", lg.get_window_extent(r)) for kind, i, lg in _legends(fig)]
    boxes += [("plot area", i, "axes", ax.get_window_extent(r)) for i, ax in enumerate(fig.axes)
              if ax.get_visible() and ax.axison]
    bad = []
    for (k1, i1, s1, b1), (k2, i2, s2, b2) in itertools.combinations(boxes, 2):
        same_axes = i1 == i2 and i1 is not None
        if (same_axes and "title" not in (k1, k2)) or k1 == k2 == "tick":
            continue
        if "plot area" in (k1, k2) and "legend" not in (k1, k2):
            continue  # texts around a plot area are matplotlib's layout; only a legend may not lie on one
        if {k1, k2} == {"legend", "plot area"} and (same_axes or _twins(fig, i1, i2)):
            continue  # a legend inside its own axes (or its twin: the same plot area)
        if b1.overlaps(b2):
            bad.append((f"{k1}[{i1}] {s1!r}", f"{k2}[{i2}] {s2!r}"))
    return bad
