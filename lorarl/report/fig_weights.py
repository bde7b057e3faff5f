"""Paper 004's weight-space figures from the diagnose stage (diagnostics.parquet, lorarl.diagnose.weights):
bf16-aware update sparsity (Table 1), the largest principal angle of the top-k subspace and the
normalised spectral drift per matrix (Fig. 5 right), and the overlap of the updated entries with the
principal / low-magnitude / principal-not-low masks against the random baseline (Fig. 6, §4)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register

OVERLAPS = ("principal", "low_magnitude", "principal_not_low")


def _scalar(data: StudyData, metrics: list[str]) -> pd.DataFrame:
    """Per group, matrix, metric: the mean over seeds of the scalar diagnostics (index 0)."""
    d = data.diag[data.diag["metric"].isin(metrics) & (data.diag["index"] == 0)]
    d = d.assign(group=draw.series_labels(d, data.keys))
    return d.groupby(["group", "matrix", "metric"], sort=False)["value"].mean().reset_index()


@register("update_sparsity", "004 Table 1, Fig. 5, Fig. 6",
          ("diag:bf16_sparsity", "diag:max_angle_left_deg", "diag:overlap_principal"),
          "Left: bf16-aware update sparsity (fraction of weights unchanged), mean over matrices and seeds. "
          "Middle: largest principal angle of the top-k left singular subspace per matrix. Right: "
          "overlap of updated entries with each reference mask divided by the mask density (1 = random).")
def update_sparsity(data: StudyData, out: Path) -> Path | None:
    names = ["bf16_sparsity", "max_angle_left_deg", "spectral_drift"]
    names += [f"overlap_{t}" for t in OVERLAPS] + [f"overlap_{t}_baseline" for t in OVERLAPS]
    table = _scalar(data, names)
    if table.empty:
        return None
    groups = list(dict.fromkeys(table["group"]))
    cs = [draw.color_of(g) for g in groups]
    plt = draw.plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    sp = table[table["metric"] == "bf16_sparsity"].groupby("group", sort=False)["value"].mean().reindex(groups)
    axes[0].bar(range(len(groups)), sp.values, color=cs)
    axes[0].set_xticks(range(len(groups)), groups, rotation=30, ha="right", fontsize=7)
    axes[0].set_ylabel("update sparsity (bf16)")
    axes[0].set_ylim(0, 1)
    ang = table[table["metric"] == "max_angle_left_deg"]
    mats = list(dict.fromkeys(ang["matrix"]))
    for color, g in zip(cs, groups):
        a = ang[ang["group"] == g].set_index("matrix")["value"].reindex(mats)
        axes[1].plot(range(len(mats)), a.values, marker=".", color=color, label=g)
    axes[1].set_xticks(range(len(mats)), [m.replace("model.layers.", "L").replace("self_attn.", "")
                                          .replace("mlp.", "") for m in mats], rotation=90, fontsize=5)
    axes[1].set_ylabel("largest principal angle (deg)")
    axes[1].legend(fontsize=6)
    width = 0.8 / len(groups)
    for i, (color, g) in enumerate(zip(cs, groups)):
        sub = table[table["group"] == g].groupby("metric")["value"].mean()
        ratio = [sub.get(f"overlap_{t}", float("nan")) / sub.get(f"overlap_{t}_baseline", float("nan"))
                 for t in OVERLAPS]
        axes[2].bar([j + i * width for j in range(len(OVERLAPS))], ratio, width=width, color=color, label=g)
    axes[2].axhline(1.0, ls="--", color="0.3", lw=1)
    axes[2].set_xticks([j + 0.4 - width / 2 for j in range(len(OVERLAPS))], OVERLAPS, fontsize=7)
    axes[2].set_ylabel("overlap / random baseline")
    fig.suptitle(f"{data.study.name}: update sparsity, principal angles, mask overlaps")
    return draw.save(fig, out, table)


VIEWS = (("update", "ΔW = W+ − W0", "-"), ("product_update", "(α/r)BA, the adapter product", "--"))


@register("update_views", "003 Fig. 3", ("diag:product_update_p",),
          "SVD-aligned update distribution p_i and cumulative energy along W0's singular directions (by σ, "
          "descending), mean over matrices and seeds (a matrix's cumulative energy held at its final value past its last direction), in two views: solid = the weight change ΔW = W+ − W0, "
          "dashed = the adapter product (α/r)BA that paper 003 Fig. 3 decomposes. They differ for residual "
          "inits (PiSSA, MiLoRA, OLoRA, ...: ΔW = (α/r)(BA − B0A0)); only cells with such an init have the dashed view.")
def update_views(data: StudyData, out: Path) -> Path | None:
    metrics = [f"{v}_{q}" for v, _, _ in VIEWS for q in ("p", "cum_energy")]
    d = data.diag[data.diag["metric"].isin(metrics)]
    if d.empty:
        return None
    d = d.assign(group=draw.series_labels(d, data.keys))
    table = draw.spectrum_curves(d, ["group"])  # cum_energy stays monotone over matrices of unequal size
    groups = list(dict.fromkeys(table["group"]))
    plt = draw.plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for g in groups:
        color = draw.color_of(g)
        for view, label, ls in VIEWS:
            for ax, q in zip(axes, ("p", "cum_energy")):
                c = table[(table["group"] == g) & (table["metric"] == f"{view}_{q}")]
                if not c.empty:
                    ax.plot(c["index"] + 1, c["value"], ls=ls, color=color, label=f"{g}: {label}")
    for ax, title in zip(axes, ("update distribution p_i = c_i / Σ c_j", "cumulative update energy Σ_{j≤i} c_j² / Σ c_j²")):
        ax.set_xscale("log")
        ax.set_xlabel("singular direction i of W0 (by σ, descending)")
        ax.set_title(f"{title}\nsolid: ΔW = W+ − W0; dashed: (α/r)BA")
    axes[1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{data.study.name}: update along W0's directions, weight change vs adapter product")
    return draw.save(fig, out, table)
