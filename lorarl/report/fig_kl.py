"""Paper 000's with/without-KL comparisons: Fig. 3b (reward as a function of KL, one point per setting from
the last 50 training steps, or the whole of a shorter run: the caption says which) and Tables 2-4's "Δ Average" row (the mean over the other settings, e.g. ranks,
of the difference without KL − with KL, per benchmark and for the runtime)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.data import StudyData
from lorarl.report.registry import register

WINDOW = 50  # paper 000 Fig. 3b: "the average KL and reward over the last 50 training steps"


def _kl_metric(data: StudyData) -> str:
    return next(m for m in ("kl_ref/k3", data.train_column("kl")) if m in data.curves and data.curves[m].notna().any())


def last_steps_mean(data: StudyData, metric: str, window: int = WINDOW) -> pd.DataFrame:
    """Per cell: the mean of ``metric`` over its last ``window`` training steps (the values logged there), and
    ``window_steps``: how many training steps that window really spans (all of a shorter run)."""
    c = data.curves.dropna(subset=[metric])
    last = c.groupby("cell")["step"].transform("max")
    g = c[c["step"] > last - window].groupby("cell", sort=False)
    v = g[metric].mean().rename("value").to_frame().join(real_window(data, window))
    return data.cells.set_index("cell")[[*data.study.axes]].join(v, how="inner").reset_index()


def real_window(data: StudyData, window: int = WINDOW) -> pd.Series:
    """Per cell: the training steps the last-``window`` mean spans: ``window``, or the whole run when shorter."""
    last = data.curves.groupby("cell", sort=False)["step"].max()
    return last.clip(upper=window).astype(int).rename("window_steps")


def window_text(data: StudyData | None) -> str:
    """The window the figure really averages over: "last 50 training steps", "last 30 training steps (the
    whole run; the paper's window is 50)", or a range when cells differ."""
    if data is None or data.curves.empty:
        return f"last {WINDOW} training steps"
    w = sorted(set(real_window(data).tolist()))
    text = f"last {w[0]}" + (f"-{w[-1]}" if len(w) > 1 else "") + " training steps"
    return text if w[-1] >= WINDOW else text + f" (the whole run; the paper's window is {WINDOW})"


def _caption_vars(data: StudyData) -> dict:
    return {"window": window_text(data)}


@register("reward_vs_kl", "000 Fig. 3b", ("curve:reward", "curve:kl_ref/k3|curve:kl"),
          "Training reward against KL(π‖π_base) (k3), each the mean over a cell's {window}, one "
          "point per setting (mean ± sd over seeds in both directions). Paper 000: LoRA keeps its reward "
          "without the KL term where full fine-tuning collapses.", caption_vars=_caption_vars)
def reward_vs_kl(data: StudyData, out: Path) -> Path | None:
    kl = _kl_metric(data)
    keys = data.keys
    x = draw.over_seeds(last_steps_mean(data, kl), keys).rename(columns={"mean": "kl_mean", "std": "kl_sd"})
    rw = last_steps_mean(data, "reward")
    y = draw.over_seeds(rw, keys).rename(columns={"mean": "reward_mean", "std": "reward_sd"})
    if x.empty or y.empty:
        return None
    y["window_steps"] = draw.over_seeds(rw, keys, "window_steps")["mean"].round().astype(int)  # the real window
    df = x.drop(columns="count").merge(y, on=keys) if keys else pd.concat([x.drop(columns="count"), y], axis=1)
    df = df.assign(kl_metric=kl)
    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(5.8, 4))
    for _, r in df.iterrows():
        lab = draw.series_label(r, keys)
        ax.errorbar(r["kl_mean"], r["reward_mean"], xerr=_sd(r["kl_sd"]), yerr=_sd(r["reward_sd"]), marker="o",
                    ms=6, capsize=3, ls="none", color=draw.color_of(lab), label=lab)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlabel(f"{kl},\nmean over the {window_text(data)}")  # two lines: one ran past the canvas
    ax.set_ylabel("train reward, same window")
    ax.set_title(f"{data.study.name}: reward vs KL to the base")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return draw.save(fig, out, df)


def _sd(v: float) -> float:
    return 0.0 if pd.isna(v) else float(v)


def kl_delta_table(data: StudyData) -> pd.DataFrame:
    """Paper 000 Tables 2-4: per setting of the other axes (e.g. rank), each headline benchmark and the
    runtime (minutes, KL monitors excluded) without KL and with it (mean ± sd over seeds), then the
    ``Δ Average`` row: the mean over those settings of (without KL − with KL). Empty unless a
    ``train.beta`` axis has 0 and a positive value."""
    from lorarl.report.tables import per_cell_runtime, primary_metrics

    axis = data.axis_by_field("train.beta")
    if axis is None or data.cells.empty:
        return pd.DataFrame()
    beta = beta_by_label(data, axis)
    cells = data.cells.assign(kl_term=data.cells[axis].map(lambda lab: "w/o" if beta.get(str(lab)) == 0 else "w"))
    if set(cells["kl_term"]) != {"w/o", "w"}:
        return pd.DataFrame()
    rt = per_cell_runtime(data)
    if not rt.empty:
        cells = cells.join(rt["train_min"], on="cell")
    cols = [*primary_metrics(data), *(["train_min"] if "train_min" in cells else [])]
    others = [k for k in data.keys if k != axis]
    g = cells.groupby(["kl_term", *others], sort=False)[cols]
    table = g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_sd")).join(g.size().rename("n_seeds"))
    table = table.reset_index()
    means = table.set_index(["kl_term", *others])[[f"{c}_mean" for c in cols]]
    diff = (means.loc["w/o"] - means.loc["w"]).mean()  # over the other settings (the ranks)
    delta = {"kl_term": "Δ Average (w/o − w)", **{k: "" for k in others}, **diff.to_dict()}
    order = {"w/o": 0, "w": 1}
    table = table.sort_values("kl_term", key=lambda s: s.map(order), kind="stable")
    return pd.concat([table, pd.DataFrame([delta])], ignore_index=True)


def beta_by_label(data: StudyData, axis: str) -> dict[str, float]:
    """Label -> train.beta of each value of the study's KL axis (plain numbers, or bundles that set it)."""
    from lorarl.language.study import Bundle, label_of

    out = {}
    for v in data.study.axes[axis].values:
        out[label_of(v)] = float(v.set.get("train.beta", 0.0)) if isinstance(v, Bundle) else float(v)
    return out
