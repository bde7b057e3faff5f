"""Paper 001's stability figures: Fig. 3 (pass@1 climbs then cliffs as frac_truncated saturates the
token cap; collapse flags marked) and Fig. 4 (peak advantage std by regime, per-cell max, mean over
seeds, dashed line at 1)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register


def regime_keys(data: StudyData) -> list[str]:
    """Series of these figures: the reward-regime axis if the study has one, else the non-seed,
    non-rank axes (paper 001 averages over ranks within a regime)."""
    reg = data.axis_by_field("reward.regime")
    if reg:
        return [reg]
    rank = data.axis_by_field("adapter.rank")
    return [k for k in data.keys if k != rank]


def _caption_vars(data: StudyData) -> dict:
    """What the series are, in the study's own axes: a caption names no axis the study lacks."""
    keys = regime_keys(data)
    rank = data.axis_by_field("adapter.rank")
    within = f" (its {rank} values and seeds)" if rank else " (its seeds)"
    if data.axis_by_field("reward.regime"):
        per = "reward regime"
    elif keys:
        per = f"setting of {', '.join(keys)}"
    else:
        return {"per": "study", "over": "all its cells"}
    return {"per": per, "over": f"all cells of a {per}{within}"}


@register("collapse_truncation", "001 Fig. 3", ("curve:frac_truncated", "evcurve|curve:accuracy"),
          "Collapse: accuracy (held-out at snapshots when the study has them, else the training batch's) "
          "mean ± sd over {over}, with frac_truncated on the right axis (dotted); "
          "ticks = steps where a collapse flag fired.", caption_vars=_caption_vars)
def collapse_truncation(data: StudyData, out: Path) -> Path | None:
    keys = regime_keys(data)
    attach = data.cells.set_index("cell")[[*data.study.axes]]
    if not data.evcurves.empty:
        acc = data.evcurves.rename(columns={"value": "acc"})[["cell", "step", "acc"]]
        acc_label = "held-out " + str(data.evcurves["metric"].iloc[0])
    else:
        acc = data.curves[["cell", "step", "accuracy"]].rename(columns={"accuracy": "acc"})
        acc_label = "train accuracy"
    trunc = data.curves[["cell", "step", "frac_truncated"]]
    rows = []
    for name, df in (("acc", acc), ("frac_truncated", trunc)):
        df = df.dropna().join(attach, on="cell")
        g = df.assign(_all="all").groupby([*(keys or ["_all"]), "step"], sort=False)[df.columns[2]]
        g = g.agg(["mean", "std"]).reset_index().assign(series=name)
        rows.append(g.drop(columns=["_all"], errors="ignore"))
    table = pd.concat(rows, ignore_index=True)
    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax2 = ax.twinx()
    groups = list(dict.fromkeys(map(tuple, table[keys].astype(str).values))) if keys else [()]
    flag_cols = [c for c in data.cells if str(c).startswith("flag/")]
    parts, cell_parts = draw.by_series(table, keys), draw.by_series(data.cells, keys)
    for grp in groups:
        part = parts.get(grp, table.iloc[:0])
        lab = ", ".join(f"{k}={v}" for k, v in zip(keys, grp)) or "all"
        color = draw.color_of(lab)
        a = part[part["series"] == "acc"].sort_values("step")
        t = part[part["series"] == "frac_truncated"].sort_values("step")
        ax.plot(a["step"], a["mean"], color=color, marker="o", ms=2, label=lab)
        ax.fill_between(a["step"], a["mean"] - a["std"].fillna(0), a["mean"] + a["std"].fillna(0), color=color,
                        alpha=0.15, lw=0)
        ax2.plot(t["step"], t["mean"], color=color, ls=":", lw=1.2)
        cells = cell_parts.get(grp, data.cells.iloc[:0])
        for fc in flag_cols:
            for st in cells[fc].dropna():
                ax.axvline(float(st), color=color, alpha=0.35, lw=0.8, ymax=0.06)
    ax.set_xlabel("training step")
    ax.set_ylabel(acc_label)
    ax2.set_ylabel("frac_truncated (dotted)")
    ax2.set_ylim(0, 1.05)
    ax2.grid(False)
    ax.set_title(f"{data.study.name}: accuracy and truncation over training")
    ax.legend(fontsize=7, loc="upper left")
    return draw.save(fig, out, table)


@register("adv_std_peak", "001 Fig. 4", ("curve:adv/std",),
          "Peak advantage std per {per}: per-cell max of adv/std over training, mean ± sd over "
          "{over}; dashed line = 1 (group-normalised advantages).", caption_vars=_caption_vars)
def adv_std_peak(data: StudyData, out: Path) -> Path | None:
    keys = regime_keys(data)
    per = draw.per_cell(data, "adv/std", "max")
    df = draw.over_seeds(per, keys)
    if df.empty:
        return None
    labels = [draw.series_label(r, keys) for _, r in df.iterrows()]
    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.8 * len(df)), 3.6))
    ax.bar(range(len(df)), df["mean"], yerr=df["std"].fillna(0), capsize=3, color=[draw.color_of(lab) for lab in labels])
    ax.axhline(1.0, ls="--", color="0.3", lw=1)
    ax.set_xticks(range(len(df)), labels, rotation=20, ha="right")
    ax.set_ylabel("peak adv/std (per-cell max)")
    ax.set_title(f"{data.study.name}: peak advantage std")
    return draw.save(fig, out, df.assign(metric="max adv/std"))
