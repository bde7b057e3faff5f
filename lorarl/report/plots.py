"""Figures of a study. Each PNG gets the CSV of exactly what it draws beside it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report.draw import plt as pyplot
from lorarl.report.draw import color_of, fit, series_label, series_labels, single_points, spectrum_curves
from lorarl.language.study import Study


def _save(fig, out: Path) -> Path:
    for ax in fig.axes:
        single_points(ax)
    fit(fig)  # every label and legend inside the canvas (lorarl.report.draw.fit)
    fig.savefig(out)
    pyplot().close(fig)
    return out


def _band(ax, x, mean, sd, color, label: str, bounds: tuple[float, float] | None = None, **line) -> None:
    """A mean line with a ± sd band (sd NaN = one seed: no band), clipped to the metric's range."""
    ax.plot(x, mean, color=color, lw=1.6, label=label, **line)
    sd = sd.fillna(0)
    lo, hi = (mean - sd, mean + sd) if bounds is None else ((mean - sd).clip(lower=bounds[0]),
                                                              (mean + sd).clip(upper=bounds[1]))
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)


def _axis_by_field(study: Study, field: str) -> str | None:
    return next((n for n, a in study.axes.items() if a.field == field), None)


def reward_curves(study: Study, curves: pd.DataFrame, out: Path, metric: str = "reward",
                  smooth: int = 5) -> Path | None:
    """Training reward vs step, one line per group (non-seed axes), band = ± sd over seeds, clipped to the
    reward's range where lorarl knows it (lorarl.report.bounds)."""
    from lorarl.report.bounds import consistent, reward_bounds
    from lorarl.language.study import every_cell

    if metric not in curves:
        return None
    cfg = {c.id: c.config for c in every_cell(study)}  # with the seeds a hypothesis added
    keys = [a for a in study.axes if a != study.seed_axis]
    df = curves.sort_values("step").copy()
    df["smoothed"] = df.groupby("cell")[metric].transform(lambda s: s.rolling(smooth, min_periods=1).mean())
    stats = df.groupby(keys + ["step"] if keys else ["step"], sort=False)["smoothed"].agg(["mean", "std"])
    stats = stats.reset_index()
    stats.to_csv(out.with_suffix(".csv"), index=False)
    fig, ax = pyplot().subplots(figsize=(7, 4))
    groups = stats.groupby(keys, sort=False) if keys else [((), stats)]
    row_label = series_labels(df, keys)
    for _, g in groups:
        label = series_label(g.iloc[0], keys)
        mine = df[row_label == label]  # the group's cells: the reward's range is theirs
        rng = consistent(reward_bounds(cfg[c] for c in mine["cell"].unique()), mine[metric]) \
            if metric == "reward" else None
        _band(ax, g["step"], g["mean"], g["std"], color_of(label), label, rng)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"train {metric} (rolling mean of {smooth})")
    ax.set_title(f"{study.name}: training {metric}, mean ± sd over {study.seed_axis}")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, out)


def base_lines(base: pd.DataFrame | None, col: str) -> list[dict]:
    """One dashed reference line per base row (one per prompt / base evaluation), never averaged:
    ``{"series": label, "mean": value}``."""
    if base is None or col not in base:
        return []
    labels = base["base"] if "base" in base else [f"base ({m})" for m in base["model"]]
    return [{"series": lab if len(base) > 1 else "base model", "mean": v}
            for lab, v in zip(labels, base[col]) if pd.notna(v)]


def accuracy_vs_rank(study: Study, cells: pd.DataFrame, out: Path, metric: str = "synthetic/pass@1",
                     base: pd.DataFrame | None = None) -> Path | None:
    """Held-out accuracy (`<benchmark>/<metric>`) vs adapter rank, one line per setting of the other
    non-seed axes (KL coefficient, prompt, lr, ...; mean ± sd over seeds only); each base row dashed."""
    rank_axis = _axis_by_field(study, "adapter.rank")
    if rank_axis is None or metric not in cells:
        return None
    others = [a for a in study.axes if a not in (rank_axis, study.seed_axis) and a in cells]
    order = list(dict.fromkeys(cells[rank_axis]))
    g = cells.groupby([rank_axis] + others, sort=False)[metric].agg(["mean", "std", "count"]).reset_index()
    g.insert(0, "series", series_labels(g, others) if others else metric)
    lines = base_lines(base, metric)
    pd.concat([g, pd.DataFrame(lines)], ignore_index=True).to_csv(out.with_suffix(".csv"), index=False)
    fig, ax = pyplot().subplots(figsize=(6.5, 3.8))
    series = list(dict.fromkeys(g["series"]))
    for name in series:
        sub = g[g["series"] == name]
        ax.errorbar([order.index(v) for v in sub[rank_axis]], sub["mean"], yerr=sub["std"].fillna(0), marker="o",
                    capsize=3, lw=1.6, color=color_of(name), label=name)
    for j, line in enumerate(lines):
        ax.axhline(line["mean"], ls="--", color=str(0.2 + 0.2 * (j % 4)), lw=1.2, label=line["series"])
    ax.set_xticks(range(len(order)), order)
    ax.set_xlabel(f"{rank_axis} (adapter rank)")
    ax.set_ylabel(f"held-out {metric}")
    ax.set_title(f"{study.name}: {metric} vs rank, mean ± sd over {study.seed_axis}")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return _save(fig, out)


def study_figures(study: Study, cells: pd.DataFrame, curves: pd.DataFrame, fdir: Path,
                  base: pd.DataFrame | None = None) -> dict[str, Path]:
    from lorarl.report.columns import headlines, primary_columns

    made = {"train_reward": reward_curves(study, curves, fdir / "train_reward.png")}
    for col in primary_columns(cells, headlines(study)):  # one accuracy-vs-rank figure per benchmark (its headline metric)
        bench = col.split("/")[0]
        made[f"pass1_vs_rank_{bench}"] = accuracy_vs_rank(study, cells, fdir / f"pass1_vs_rank_{bench}.png", col, base)
    return {k: v for k, v in made.items() if v is not None}


def eval_curve(study: Study, df: pd.DataFrame, base: pd.DataFrame | None, out: Path) -> Path:
    """Held-out primary metric (pass@1 or avg@n) of one benchmark vs training step, one line per
    group (non-seed axes), band = ± sd over seeds; each base model a dashed line."""
    keys = [a for a in study.axes if a != study.seed_axis]
    bench, metric = df["benchmark"].iloc[0], df["metric"].iloc[0]
    stats = df.groupby(keys + ["step"] if keys else ["step"], sort=False)["value"].agg(["mean", "std", "count"])
    stats = stats.reset_index()
    stats.insert(0, "series", series_labels(stats, keys))
    order = {name: i for i, name in enumerate(dict.fromkeys(stats["series"]))}
    stats = stats.sort_values(["series", "step"], key=lambda c: c.map(order) if c.name == "series" else c)
    col = f"{bench}/{metric}"
    lines = base_lines(base, col)
    drawn = pd.concat([stats, pd.DataFrame(lines)], ignore_index=True)
    drawn.astype({"step": "Int64", "count": "Int64"}).to_csv(out.with_suffix(".csv"), index=False)
    fig, ax = pyplot().subplots(figsize=(7, 4))
    series = list(dict.fromkeys(stats["series"]))
    for name in series:
        g = stats[stats["series"] == name]
        color = color_of(name)
        _band(ax, g["step"], g["mean"], g["std"], color, name, marker="o", ms=3)
    for j, line in enumerate(lines):
        ax.axhline(line["mean"], ls="--", color=str(0.2 + 0.2 * j), lw=1.2, label=line["series"])
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out {bench} {metric}")
    ax.set_title(f"{study.name}: {bench} {metric} over training, mean ± sd over {study.seed_axis}")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, out)


def eval_curve_figures(study: Study, evcurves: pd.DataFrame, base: pd.DataFrame | None,
                       fdir: Path) -> dict[str, Path]:
    """One `eval_curve_<benchmark>.png` (+ .csv) per benchmark evaluated at snapshots."""
    return {f"eval_curve_{b}": eval_curve(study, df, base, fdir / f"eval_curve_{b}.png")
            for b, df in evcurves.groupby("benchmark", sort=False)}


def diagnostics_figure(study: Study, diag: pd.DataFrame, out: Path) -> Path | None:
    """Per group (non-seed axes), mean over seeds: spectral drift and largest principal angle per
    matrix; the SVD-aligned update distribution p_i and its cumulative energy along W0's singular
    directions (mean over matrices); subspace similarity of A with W0's top/bottom-r directions."""
    if diag.empty:
        return None
    keys = [a for a in study.axes if a != study.seed_axis]
    diag = diag.assign(group=series_labels(diag, keys))
    scal = diag[diag["metric"].isin(["spectral_drift", "max_angle_left_deg"])]
    per_matrix = scal.groupby(["group", "matrix", "metric"], sort=False)["value"].mean().unstack("metric")
    per_matrix.to_csv(out.with_name(out.stem + "_per_matrix.csv"))
    curves = diag[diag["metric"].isin(["update_p", "update_cum_energy"])]
    curves = spectrum_curves(curves, ["group"]).set_index(["group", "metric", "index"])["value"]
    curves.to_csv(out.with_name(out.stem + "_curves.csv"))
    curves = curves.sort_index()  # looked up by (group, metric) below: unsorted, pandas warns at each lookup
    sim = diag[diag["metric"].isin(["subspace_sim_top", "subspace_sim_bottom"])]
    sim = sim.groupby(["group", "metric"], sort=False)["value"].mean().unstack("metric")
    fig, axes = pyplot().subplots(2, 3, figsize=(13, 7))
    axes = axes.ravel()
    groups = list(dict.fromkeys(diag["group"]))
    matrices = list(dict.fromkeys(per_matrix.index.get_level_values("matrix")))
    for g in groups:
        color = color_of(g)
        sub = per_matrix.loc[g].reindex(matrices)
        axes[0].plot(range(len(matrices)), sub["spectral_drift"], marker=".", color=color, label=g)
        axes[1].plot(range(len(matrices)), sub["max_angle_left_deg"], marker=".", color=color, label=g)
        for ax, metric in ((axes[3], "update_p"), (axes[4], "update_cum_energy")):
            c = curves.loc[(g, metric)]
            ax.plot(c.index + 1, c.values, color=color, label=g)
    for ax, title in zip(axes[:2], ("spectral drift ‖σ(W+)−σ(W0)‖/‖σ(W0)‖", "largest principal angle, top-k left (deg)")):
        ax.set_xticks(range(len(matrices)), [m.replace("model.layers.", "L").replace("self_attn.", "").replace("mlp.", "")
                                               for m in matrices], rotation=90, fontsize=6)
        ax.set_title(title)
    for ax, title in ((axes[3], "update distribution p_i = c_i / Σ c_j\nof ΔW = W+ − W0"),  # two lines: one
                      (axes[4], "cumulative energy Σ_{j≤i} c_j² / Σ c_j²\nof ΔW = W+ − W0")):  # ran into the next
        ax.set_xscale("log")
        ax.set_xlabel("singular direction i of W0 (by σ, descending)")
        ax.set_title(title)
    if not sim.empty:
        sim = sim.reindex(groups)
        x = range(len(sim))
        axes[2].bar([v - 0.2 for v in x], sim.get("subspace_sim_top"), width=0.4, label="top-r of W0")
        axes[2].bar([v + 0.2 for v in x], sim.get("subspace_sim_bottom"), width=0.4, label="bottom-r of W0")
        axes[2].set_xticks(list(x), sim.index, rotation=30, ha="right", fontsize=7)
        axes[2].set_title("subspace similarity ‖A V‖_F / ‖A‖_F")
        axes[2].legend(fontsize=7)
    else:
        axes[2].axis("off")
    axes[5].axis("off")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[5].legend(handles, labels, loc="center", fontsize=8, title="group")
    fig.suptitle(f"{study.name}: weight-space diagnostics, mean over {study.seed_axis}")
    return _save(fig, out)
