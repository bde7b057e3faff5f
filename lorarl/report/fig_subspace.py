"""Paper 003 Fig. 7: the subspace similarity ‖A V‖_F / ‖A‖_F of the learned LoRA A with W0's principal (top-r)
and minor (bottom-r) right singular vectors (lorarl.diagnose.weights.subspace_similarity), per layer (left:
the mean over a transformer layer's linear modules at the end of training) and averaged over all linear
layers through training (right: at the cell's eval_every snapshots and its last step, the diagnose stage's
``subspace_sim_*_step`` rows). Top row: principal; bottom row: minor. Mean over seeds, one line per setting."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register

WHICH = (("top", "principal (top-r) right singular vectors of W0"), ("bottom", "minor (bottom-r) right singular vectors"))
LAYER = r"layers\.(\d+)\."  # the transformer layer a module belongs to (model.layers.<i>.mlp.up_proj)


def subspace_table(data: StudyData) -> pd.DataFrame:
    """Long: group, metric (subspace_sim_top | subspace_sim_bottom), layer (per-layer rows, at the end), step
    (through-training rows, mean over every linear layer), value (mean over seeds)."""
    d = data.diag
    d = d.assign(group=draw.series_labels(d, data.keys))
    end = d[d["metric"].isin([f"subspace_sim_{w}" for w, _ in WHICH]) & (d["index"] == 0)]
    end = end.assign(layer=end["matrix"].str.extract(LAYER, expand=False).astype(float)).dropna(subset=["layer"])
    per_cell = end.groupby(["group", "cell", "metric", "layer"], sort=False)["value"].mean()  # a layer's modules
    per_layer = per_cell.groupby(["group", "metric", "layer"], sort=False).mean().reset_index()  # then seeds
    steps = d[d["metric"].isin([f"subspace_sim_{w}_step" for w, _ in WHICH])]
    per_cell = steps.groupby(["group", "cell", "metric", "index"], sort=False)["value"].mean()  # all layers
    over = per_cell.groupby(["group", "metric", "index"], sort=False).mean().reset_index()
    over = over.rename(columns={"index": "step"}).assign(metric=lambda x: x["metric"].str.removesuffix("_step"))
    return pd.concat([per_layer.assign(step=float("nan")), over.assign(layer=float("nan"))], ignore_index=True)[
        ["group", "metric", "layer", "step", "value"]]


@register("subspace_similarity", "003 Fig. 7", ("diag:subspace_sim_top",),
          "Subspace similarity ‖A V‖_F / ‖A‖_F of the learned LoRA A with W0's principal (top row, top-r) and "
          "minor (bottom row, bottom-r) right singular vectors: left, per layer at the end of training (mean "
          "over a layer's linear modules and seeds); right, the mean over all linear layers through training, at "
          "the eval_every snapshots and the last step. Paper 003: LoRA-RLPO stays on the principal vectors, "
          "LoRA-RLMO on the minor ones, DCT/Wavelet-LoRA low on both.")
def subspace_similarity(data: StudyData, out: Path) -> Path | None:
    table = subspace_table(data)
    if table.empty:
        return None
    groups = list(dict.fromkeys(table["group"]))
    plt = draw.plt()
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), squeeze=False)
    for row, (w, title) in enumerate(WHICH):
        part = table[table["metric"] == f"subspace_sim_{w}"]
        for g in groups:
            mine = part[part["group"] == g]
            layers = mine.dropna(subset=["layer"]).sort_values("layer")
            steps = mine.dropna(subset=["step"]).sort_values("step")
            axes[row][0].plot(layers["layer"], layers["value"], marker=".", color=draw.color_of(g), label=g)
            axes[row][1].plot(steps["step"], steps["value"], marker="o", ms=3, color=draw.color_of(g), label=g)
        axes[row][0].set_title(f"per layer, end of training:\n{title}")
        axes[row][1].set_title(f"mean over linear layers, through training:\n{title}")
        axes[row][0].set_ylabel("‖A V‖_F / ‖A‖_F")
        for ax in axes[row]:
            ax.set_ylim(0, 1.02)
    from matplotlib.ticker import MaxNLocator

    for ax in axes[:, 0]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1][0].set_xlabel("layer")
    axes[1][1].set_xlabel("training step")
    axes[0][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"{data.study.name}: subspace similarity of LoRA A with W0's singular vectors")
    return draw.save(fig, out, table)
