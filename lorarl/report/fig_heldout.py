"""Held-out curves over training (the eval_every snapshots and the final adapter, `StudyData.evcurves`):

* paper 001 Fig. 5: the held-out metric per reward regime, the mean over every cell of the regime (ranks and
  seeds), dashed = the base model (the untrained student);
* paper 004 Figs. 10-11: one panel per setting of the axes the study's `baseline:` does not name (e.g. model x
  rank x lr), one line per value of those it names (LoRA vs PiSSA), a row of panels per benchmark: where a
  variant "collapses early" shows as its curve falling away from the baseline's.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register


def _students(data: StudyData, col: str) -> list[tuple[str, float]]:
    """(label, value) of each untrained student base row with the column (a distillation teacher row is not one)."""
    b = data.base
    if b.empty or col not in b:
        return []
    rows = b[b["role"].astype(str) != "teacher"] if "role" in b else b
    return [(str(r["base"]), float(r[col])) for _, r in rows.iterrows() if pd.notna(r[col])]


@register("heldout_by_regime", "001 Fig. 5", ("axis:reward.regime", "evcurve"),
          "Held-out headline metric over training per reward regime: the mean over every cell of the regime "
          "(all ranks and seeds), band ± sd over those cells, at the eval_every snapshots and the final step; "
          "dashed = the untrained student. Paper 001: outcome climbs and holds, distillation climbs, process "
          "climbs then hacks below the base.")
def heldout_by_regime(data: StudyData, out: Path) -> Path | None:
    regime = data.axis_by_field("reward.regime")
    ev = data.evcurves
    table = (ev.groupby(["benchmark", "metric", regime, "step"], sort=False)["value"].agg(["mean", "std", "count"])
             .reset_index())
    benches = list(dict.fromkeys(table["benchmark"]))
    plt = draw.plt()
    fig, axes = plt.subplots(1, len(benches), figsize=(6.5 * len(benches), 4), squeeze=False)
    for ax, bench in zip(axes[0], benches):
        part = table[table["benchmark"] == bench]
        metric = str(part["metric"].iloc[0])
        for lab in dict.fromkeys(part[regime]):
            g = part[part[regime] == lab].sort_values("step")
            color = draw.color_of(f"{regime}={lab}")
            ax.plot(g["step"], g["mean"], marker="o", ms=3, color=color, label=f"{regime}={lab}")
            sd = g["std"].fillna(0)
            ax.fill_between(g["step"], g["mean"] - sd, g["mean"] + sd, color=color, alpha=0.15, lw=0)
        for j, (lab, v) in enumerate(_students(data, f"{bench}/{metric}")):
            ax.axhline(v, ls="--", color=str(0.2 + 0.2 * (j % 4)), lw=1.2, label=f"{lab} (untrained)")
        ax.set_xlabel("training step")
        ax.set_ylabel(f"held-out {bench} {metric}")
        ax.set_title(f"{bench} {metric}, mean over each regime's cells")
        ax.legend(fontsize=7)
    fig.suptitle(f"{data.study.name}: held-out accuracy over training per reward regime")
    return draw.save(fig, out, table)


@register("heldout_vs_baseline", "004 Figs. 10-11", ("evcurve",),
          "Held-out headline metric over training (eval_every snapshots and the final step), one panel per "
          "setting of the axes the study's baseline does not name, one line per value of those it names (the "
          "baseline's drawn thicker), mean ± sd over seeds; a row of panels per benchmark. Paper 004: PiSSA "
          "gives no gain over LoRA and, at the higher learning rates, collapses early.")
def heldout_vs_baseline(data: StudyData, out: Path) -> Path | None:
    base = data.study.baseline
    if not base:
        return None
    named = [k for k in data.keys if k in base]
    panels = [k for k in data.keys if k not in base]
    ev = data.evcurves.assign(series=draw.series_labels(data.evcurves, named),
                              group=draw.series_labels(data.evcurves, panels))
    table = (ev.groupby(["benchmark", "metric", "group", "series", "step"], sort=False)["value"]
             .agg(["mean", "std", "count"]).reset_index())
    from lorarl.language.study import label_of

    baseline = draw.series_label({k: label_of(base[k]) for k in named}, named)
    rows = list(dict.fromkeys(table["benchmark"]))
    ncols = max(table[table["benchmark"] == b]["group"].nunique() for b in rows)
    plt = draw.plt()
    fig, axes = plt.subplots(len(rows), ncols, figsize=(2.6 * ncols + 1.6, 2.7 * len(rows)), squeeze=False)
    for r, bench in enumerate(rows):
        part = table[table["benchmark"] == bench]
        groups = list(dict.fromkeys(part["group"]))
        for c, grp in enumerate(groups):
            ax = axes[r][c]
            for s in dict.fromkeys(part["series"]):
                g = part[(part["group"] == grp) & (part["series"] == s)].sort_values("step")
                if g.empty:
                    continue
                ax.plot(g["step"], g["mean"], marker="o", ms=2, color=draw.color_of(s), label=s,
                        lw=2.2 if s == baseline else 1.2)
            ax.set_title(grp.replace(", ", "\n"), fontsize=7)
            ax.tick_params(labelsize=6)
            ax.set_xlabel("training step", fontsize=7)
            if c == 0:
                ax.set_ylabel(f"{bench} {part['metric'].iloc[0]}", fontsize=7)
        for c in range(len(groups), ncols):
            axes[r][c].set_visible(False)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{data.study.name}: held-out accuracy over training, {' / '.join(named)} per setting")
    return draw.save(fig, out, table)
