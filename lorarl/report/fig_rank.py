"""Figures against adapter rank: paper 000 Fig. 2 (KL grows with rank) and paper 001 Fig. 2
(held-out pass@1 vs rank per regime, full fine-tuning as a dashed mean with a ± 1 sd band)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register


def _kl_metric(data: StudyData) -> str:
    return next(m for m in ("kl_ref/k3", data.train_column("kl")) if m in data.curves and data.curves[m].notna().any())


def _lines(data: StudyData) -> dict:
    """The caption's series, named by the study's axes other than the rank (and the seed)."""
    rank = data.axis_by_field("adapter.rank")
    others = [k for k in data.keys if k != rank]
    return {"lines": f"one line per setting of {', '.join(others)}" if others else "one line"}


@register("kl_vs_rank", "000 Fig. 2", ("axis:adapter.rank", "curve:kl_ref/k3|curve:kl"),
          "Mean KL(π‖π_base) over training (k3, the β term's estimator) vs LoRA rank, {lines}; mean ± sd "
          "over seeds. Paper 000: KL grows with rank.", caption_vars=lambda data: _lines(data))
def kl_vs_rank(data: StudyData, out: Path) -> Path | None:
    rank = data.axis_by_field("adapter.rank")
    metric = _kl_metric(data)
    others = [k for k in data.keys if k != rank]
    df = draw.over_seeds(draw.per_cell(data, metric, "mean"), [*others, rank])
    if df.empty:
        return None
    order = draw.rank_order(data, rank)
    df = df.assign(x=df[rank].map(order.index), metric=metric).sort_values([*others, "x"])
    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    groups = df.groupby(others, sort=False) if others else [((), df)]
    for _, g in groups:
        lab = draw.series_label(g.iloc[0], others)
        ax.errorbar(g["x"], g["mean"], yerr=g["std"].fillna(0), marker="o", capsize=3, color=draw.color_of(lab),
                    label=lab)
    ax.set_xticks(range(len(order)), order)
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xlabel(f"{rank} (LoRA rank)")
    ax.set_ylabel(f"mean {metric} over training")
    ax.set_title(f"{data.study.name}: KL to the base vs rank")
    ax.legend(fontsize=7)
    return draw.save(fig, out, df.drop(columns="x"))


@register("pass1_vs_rank_fullft", "001 Fig. 2", ("axis:adapter.rank", "eval", "fullft:adapter.rank"),
          "Held-out headline metric vs LoRA rank, {lines}; "
          "dashed = full fine-tuning mean of the same setting, band = ± 1 sd over seeds. With eval_every "
          "snapshots, hollow markers = the mean per-cell peak over training (paper 001 shows process at peak).",
          caption_vars=lambda data: _lines(data))
def pass1_vs_rank_fullft(data: StudyData, out: Path) -> Path | None:
    from lorarl.report.tables import primary_metrics

    rank = data.axis_by_field("adapter.rank")
    col = primary_metrics(data)[0]
    full = draw.full_label(data, rank)
    others = [k for k in data.keys if k != rank]
    cells = data.cells.dropna(subset=[col]).rename(columns={col: "value"})
    df = draw.over_seeds(cells, [*others, rank])
    if df.empty:
        return None
    df = df.assign(metric=col)
    order = [r for r in draw.rank_order(data, rank) if r != full]
    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(5.8, 3.8))
    groups = df.groupby(others, sort=False) if others else [((), df)]
    for _, g in groups:
        lab = draw.series_label(g.iloc[0], others)
        color = draw.color_of(lab)
        lora = g[g[rank] != full].assign(x=lambda d: d[rank].map(order.index)).sort_values("x")
        ax.errorbar(lora["x"], lora["mean"], yerr=lora["std"].fillna(0), marker="o", capsize=3, color=color,
                    label=lab)
        ft = g[g[rank] == full]
        if full is not None and not ft.empty:
            m, s = float(ft["mean"].iloc[0]), float(pd.Series(ft["std"]).fillna(0).iloc[0])
            ax.axhline(m, ls="--", color=color, lw=1.2, label=f"{lab}: full FT")
            ax.axhspan(m - s, m + s, color=color, alpha=0.12, lw=0)
    peaks = _peaks(data, rank, others, order, col)
    for _, g in groups:
        color = draw.color_of(draw.series_label(g.iloc[0], others))
        key = tuple(g.iloc[0][k] for k in others)
        p = peaks[peaks[others].apply(tuple, axis=1) == key] if others and not peaks.empty else peaks
        if not p.empty:
            ax.plot(p["x"], p["peak_mean"], ls="none", marker="o", mfc="none", ms=8, color=color)
    if not peaks.empty:
        df = pd.concat([df, peaks.drop(columns="x").rename(columns={"peak_mean": "mean", "peak_sd": "std"})
                        .assign(metric=col + " (peak over training)")], ignore_index=True)
    ax.set_xticks(range(len(order)), order)
    ax.set_xlabel(f"{rank} (LoRA rank)")
    ax.set_ylabel(f"held-out {col}")
    ax.set_title(f"{data.study.name}: {col} vs rank (dashed: full FT ± 1 sd)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return draw.save(fig, out, df)


def _peaks(data: StudyData, rank: str, others: list[str], order: list[str], col: str) -> pd.DataFrame:
    """Per group: mean over seeds of each cell's peak held-out value (eval_every snapshots of `col`'s
    benchmark), LoRA ranks only; empty without snapshots."""
    from lorarl.report.tables import peak_final_table

    pf = peak_final_table(data)
    if pf.empty:
        return pd.DataFrame()
    pf = pf[(pf["benchmark"] == col.split("/")[0]) & pf[rank].astype(str).isin(order)]
    return pf[[*others, rank, "peak_mean", "peak_sd"]].assign(x=pf[rank].astype(str).map(order.index))
