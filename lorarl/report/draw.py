"""Small drawing helpers shared by the figure families (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:  # annotations only
    from lorarl.report.data import StudyData


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    pyplot.rcParams.update({
        "figure.dpi": 110, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
        "grid.alpha": 0.3, "font.size": 9, "legend.frameon": False,
    })
    return pyplot


def series_label(row: pd.Series | dict, keys: list[str]) -> str:
    return ", ".join(f"{k}={row[k]}" for k in keys) or "all"


def series_labels(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """`series_label` of every row at once (vectorised: no Python call per row)."""
    if not keys:
        return pd.Series("all", index=df.index, dtype=object)
    out = f"{keys[0]}=" + df[keys[0]].astype(str)
    for k in keys[1:]:
        out = out + f", {k}=" + df[k].astype(str)
    return out


def by_series(df: pd.DataFrame, keys: list[str]) -> dict[tuple, pd.DataFrame]:
    """Rows of `df` per series: the tuple of its key columns as strings -> those rows (one pass)."""
    if not keys:
        return {(): df}
    return {tuple(map(str, k if isinstance(k, tuple) else (k,))): g
            for k, g in df.groupby([df[k].astype(str) for k in keys], sort=False)}


_PALETTE: dict[str, tuple] = {}  # group label -> its colour, for the whole report


def palette() -> list[tuple]:
    """20 distinguishable colours: tab10, then tab20's lighter shades."""
    t10, t20 = plt().get_cmap("tab10"), plt().get_cmap("tab20")
    return [t10(i) for i in range(10)] + [t20(2 * i + 1) for i in range(10)]


def reset_palette(study: Any) -> None:
    """A new report: the study's groups (every non-seed axis, in study order) get the first colours, so a
    group has one colour in every figure and in every process that draws the study's figures."""
    import itertools

    from lorarl.language.study import label_of

    _PALETTE.clear()
    keys = [a for a in study.axes if a != study.seed_axis]
    for combo in itertools.product(*([label_of(v) for v in study.axes[k].values] for k in keys)):
        color_of(series_label(dict(zip(keys, combo)), keys))


def color_of(label: str) -> tuple:
    """The colour of a group (its series label) for the whole report; a new label takes the next one."""
    if label not in _PALETTE:
        cols = palette()
        _PALETTE[label] = cols[len(_PALETTE) % len(cols)]
    return _PALETTE[label]


def save(fig, out: Path, table: pd.DataFrame) -> Path:
    """The PNG and, beside it, the CSV of exactly what it draws: one-point panels as points on a readable
    axis, every label and legend inside the canvas."""
    table.to_csv(out.with_suffix(".csv"), index=False)
    for ax in fig.axes:
        single_points(ax)
    fit(fig)
    fig.savefig(out)
    plt().close(fig)
    return out


def fit(fig, tries: int = 4, pad_in: float = 0.05) -> None:
    """Lay the figure out (tight_layout), then grow its canvas while any artist (a long axis label wider than its
    axes, a legend placed beside them) would be cut at an edge; the axes keep their share of the canvas."""
    for _ in range(tries):
        fig.tight_layout()
        fig.canvas.draw()
        box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, every visible artist
        w, h = fig.get_size_inches()
        left, bottom = max(-box.x0, 0.0), max(-box.y0, 0.0)
        right, top = max(box.x1 - w, 0.0), max(box.y1 - h, 0.0)
        if max(left, bottom, right, top) <= 0.0:
            return
        fig.set_size_inches(w + (left + right + 2 * pad_in if left + right else 0.0),
                            h + (bottom + top + 2 * pad_in if bottom + top else 0.0), forward=False)


def single_points(ax) -> None:
    """A panel whose lines each hold one point on one shared x (a run with one snapshot, one setting): matplotlib
    would draw an invisible line on an axis spanning x ± 1 in half steps. Draw the points as markers and give
    the axis a readable span: from 0 (or the value's order of magnitude) to past the value, integer ticks
    when the value is one."""
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) and ln.get_transform() == ax.transData]  # no axhline
    xs = {float(x) for ln in lines for x in ln.get_xdata() if pd.notna(x)}
    scale = ax.get_xscale()
    if len(xs) != 1 or scale not in ("linear", "symlog", "log") or any(len(ln.get_xdata()) > 1 for ln in lines):
        return
    (x,) = xs
    for ln in lines:
        ln.set_marker(ln.get_marker() if ln.get_marker() not in (None, "None", "", " ") else "o")
        ln.set_markersize(max(ln.get_markersize(), 6.0))
    if scale == "log":
        ax.set_xlim(x / 3, 3 * x)
        return
    lo, hi = (0.0, 1.25 * x) if x > 0 else (1.25 * x, 0.0) if x < 0 else (-1.0, 1.0)
    ax.set_xlim(lo, hi)
    if scale == "linear" and float(x).is_integer():
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def rank_order(data: StudyData, rank_axis: str) -> list[str]:
    """The rank axis labels in study order (bundles such as `full` where the study put them)."""
    from lorarl.language.study import label_of

    return [label_of(v) for v in data.study.axes[rank_axis].values]


def full_label(data: StudyData, rank_axis: str) -> str | None:
    """The rank-axis label whose bundle sets adapter.method: full (the full fine-tuning row)."""
    from lorarl.language.study import Bundle

    for v in data.study.axes[rank_axis].values:
        if isinstance(v, Bundle) and v.set.get("adapter.method") == "full":
            return v.label
    return None


def per_cell(data: StudyData, metric: str, how: str) -> pd.DataFrame:
    """One value per cell from a training curve (`how`: mean, max, last), axis labels attached."""
    c = data.curves.dropna(subset=[metric])
    v = c.groupby("cell", sort=False)[metric].agg(how).rename("value")
    return data.cells.set_index("cell")[[*data.study.axes]].join(v, how="inner").reset_index()


def over_seeds(df: pd.DataFrame, keys: list[str], value: str = "value") -> pd.DataFrame:
    if not keys:
        df = df.assign(_all="all")
        keys = ["_all"]
    g = df.groupby(keys, sort=False)[value].agg(["mean", "std", "count"]).reset_index()
    return g.drop(columns=["_all"], errors="ignore")


def spectrum_curves(diag: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean per (``by``, metric, index) of the SVD-aligned curves over matrices (and seeds).  Matrices have
    different numbers of singular directions: a cumulative-energy curve (``*cum_energy``) is carried at its
    final value past its matrix's last direction, so every index averages over every matrix and the mean
    curve stays monotone; other curves average over the matrices that have index i."""
    ident = [c for c in ("cell", "matrix") if c in diag]
    cum = diag["metric"].str.endswith("cum_energy")
    parts = [diag[~cum]]
    if cum.any() and ident:
        c = diag[cum]
        parts.append(c)
        top = c.groupby([*by, "metric"], sort=False)["index"].transform("max")
        last = c.loc[c.groupby([*by, "metric", *ident], sort=False)["index"].idxmax()]
        for (_, row), n in zip(last.iterrows(), top.loc[last.index]):
            if row["index"] < n:  # pad this matrix's curve with its final value up to the group's longest
                pad = pd.DataFrame([row] * int(n - row["index"]))
                parts.append(pad.assign(index=range(int(row["index"]) + 1, int(n) + 1)))
    else:
        parts.append(diag[cum])
    out = pd.concat(parts).groupby([*by, "metric", "index"], sort=False)["value"].mean().reset_index()
    return out.sort_values("index", kind="stable").sort_values([*by, "metric"], kind="stable",
                                                                key=lambda s: s.map({v: i for i, v in enumerate(dict.fromkeys(s))}))
