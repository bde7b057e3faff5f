"""Paper 003 Figs. 2, 5, 6: training dynamics per setting: training reward, the Frobenius norm of the
gradient over trainable parameters (TRL/transformers' `grad_norm`, before clipping), KL to the base
(`kl_ref/k3`, Figs. 2, 6) and KL(π_new‖π_old) between the rollout policy and the policy after all of
a training step's updates (`kl_new_old`, the paper's Figs. 5/6 quantity; measured every
`train.kl_monitor_every` steps), and verl's `ppo_kl` (every step; lorarl.numerics.kl.ppo_kl: the mean over the
step's mini-batches of log π_old − log π on their response tokens, each before its update: what paper 003's
verl runs logged as KL(π_new‖π_old)). The KL of one optimiser update (`kl_new_old/update`) is logged too;
with PPO mini-batches it is smaller, and it is not drawn here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register

PANELS = (("reward", "training reward"), ("grad_norm", "gradient norm ‖g‖_F"),
          ("kl_ref/k3", "KL(π‖π_base), k3"), ("kl_new_old", "KL(π_new‖π_old),\nrollout → updated policy"),
          ("ppo_kl", "verl's ppo_kl: log π_old − log π,\nbefore each update"))


@register("training_dynamics", "003 Figs. 2, 5, 6",
          ("curve:reward", "curve:grad_norm|curve:kl_new_old|curve:kl_ref/k3|curve:ppo_kl"),
          "Per setting, mean over seeds (band ± sd): training reward, gradient norm, KL to the base, "
          "KL(π_new‖π_old) from the rollout policy to the policy after the step's updates (a monitor, every "
          "kl_monitor_every steps), and verl's ppo_kl (every step: the mean over the step's mini-batches of "
          "log π_old − log π on their response tokens, each taken before its update; the KL paper 003's verl "
          "logs). Paper 003: PiSSA/MiLoRA collapse with larger gradient norm and KL.")
def training_dynamics(data: StudyData, out: Path) -> Path | None:
    keys = data.keys
    panels = [(m, t) for m, t in PANELS if m in data.curves and data.curves[m].notna().any()]
    frames = []
    for m, _ in panels:
        c = data.curves.dropna(subset=[m]).assign(_all="all")
        g = c.groupby([*(keys or ["_all"]), "step"], sort=False)[m].agg(["mean", "std"]).reset_index()
        frames.append(g.drop(columns=["_all"], errors="ignore").assign(metric=m))
    table = pd.concat(frames, ignore_index=True)
    plt = draw.plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1.5, 3.6), squeeze=False)
    series = list(dict.fromkeys(map(tuple, table[keys].astype(str).values))) if keys else [()]
    for ax, (m, title) in zip(axes[0], panels):
        parts = draw.by_series(table[table["metric"] == m], keys)
        for grp in series:
            if grp not in parts:
                continue
            g = parts[grp].sort_values("step")
            lab = ", ".join(f"{k}={v}" for k, v in zip(keys, grp)) or "all"
            color = draw.color_of(lab)
            ax.plot(g["step"], g["mean"], color=color, lw=1.3, label=lab)
            ax.fill_between(g["step"], g["mean"] - g["std"].fillna(0), g["mean"] + g["std"].fillna(0),
                            color=color, alpha=0.12, lw=0)
        ax.set_title(title)
        ax.set_xlabel("training step")
    handles, labels = axes[0][0].get_legend_handles_labels()  # beside the last panel, never on it
    axes[0][-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7)
    fig.suptitle(f"{data.study.name}: training dynamics")
    return draw.save(fig, out, table)
