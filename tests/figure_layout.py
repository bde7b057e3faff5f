"""Text that overlaps in a drawn matplotlib figure: titles, axis labels and the drawn tick labels of every
visible axes, and the figure's suptitle. Two texts of the same axes may touch (a tick label and its own axis
label are laid out by matplotlib); a title may overlap nothing, and nothing may overlap across axes."""

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


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of texts whose drawn boxes intersect (see the module doc), as (text, text)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [(kind, i, t.get_text(), t.get_window_extent(r)) for kind, i, t in _texts(fig)]
    bad = []
    for (k1, i1, s1, b1), (k2, i2, s2, b2) in itertools.combinations(boxes, 2):
        same_axes = i1 == i2 and i1 is not None
        if (same_axes and "title" not in (k1, k2)) or k1 == k2 == "tick":
            continue
        if b1.overlaps(b2):
            bad.append((f"{k1}[{i1}] {s1!r}", f"{k2}[{i2}] {s2!r}"))
    return bad
