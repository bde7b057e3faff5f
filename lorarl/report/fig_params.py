"""Paper 002 Fig. 1: average accuracy vs percentage of trainable parameters (log x) per method, with
the performance frontier shaded (left), and accuracy reward over training per method (right)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register


@register("accuracy_vs_params", "002 Fig. 1", ("cell:trainable_fraction", "eval"),
          "Left: held-out accuracy (the Avg over benchmarks when there are several, taken as the avg table "
          "takes it) vs % trainable parameters (log), one point per setting, mean ± sd over seeds; shaded = "
          "frontier. Right: "
          "training accuracy reward (reward when accuracy is not logged), mean over seeds.")
def accuracy_vs_params(data: StudyData, out: Path) -> Path | None:
    from lorarl.report.tables import average_of, avg_series, primary_metrics

    cols = primary_metrics(data)
    cells = data.cells.dropna(subset=cols)
    if cells.empty:
        return None
    value, how = avg_series(data, cells, cols)  # the study's Avg (eval.average), as the avg table
    cells = cells.assign(value=value, pct=100 * cells["trainable_fraction"].astype(float))
    keys = data.keys
    g = cells.assign(_all="all").groupby(keys or ["_all"], sort=False)
    df = g["value"].agg(["mean", "std", "count"]).join(g["pct"].mean()).reset_index()
    df = df.drop(columns=["_all"], errors="ignore").assign(metric=how)
    plt = draw.plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    cs = [draw.color_of(draw.series_label(r, keys)) for _, r in df.iterrows()]
    for color, (_, r) in zip(cs, df.iterrows()):
        ax.errorbar(r["pct"], r["mean"], yerr=0 if pd.isna(r["std"]) else r["std"], marker="o", capsize=3,
                    color=color, label=draw.series_label(r, keys))
    front = df.sort_values("pct")
    front = front[front["mean"] >= front["mean"].cummax()]  # best accuracy at or below each budget
    ax.fill_between(front["pct"], front["mean"], front["mean"].min() - 0.02, step="post", color="0.5", alpha=0.15)
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters (%)")
    avg = f" (Avg, eval.average: {average_of(data.study)})"  # which Avg: paper 002's is over all samples
    ax.set_ylabel("held-out accuracy" + (avg if len(cols) > 1 else f" ({cols[0]})"))
    ax.legend(fontsize=7)
    metric = "accuracy" if "accuracy" in data.curves and data.curves["accuracy"].notna().any() else "reward"
    if metric in data.curves:
        cur = data.curves.dropna(subset=[metric]).assign(_all="all")
        cur = cur.groupby([*(keys or ["_all"]), "step"], sort=False)[metric].mean().reset_index()
        for color, (_, r) in zip(cs, df.iterrows()):
            sel = (cur[keys] == r[keys]).all(axis=1) if keys else pd.Series(True, index=cur.index)
            c = cur[sel]
            ax2.plot(c["step"], c[metric].rolling(5, min_periods=1).mean(), color=color)
        ax2.set_xlabel("training step")
        ax2.set_ylabel(f"train {metric} (rolling mean of 5)")
    fig.suptitle(f"{data.study.name}: accuracy vs trainable parameters")
    return draw.save(fig, out, df)
