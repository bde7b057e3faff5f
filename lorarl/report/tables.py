"""The study's tables with their uncertainty (lorarl.report.stats) and the papers' headline tables.

* `stats_table`: one row per group (non-seed axes), each headline column as mean ± sd [95%] (the
  two-level interval of lorarl.report.stats over seeds and the per-problem scores of the column's own
  metric: avg@k, pass@k) and, when the study declares `baseline:`, the difference to the baseline row of
  the same group (the baseline axes replaced by their baseline labels; paired by seed where both rows have
  the same seeds, `paired_on`), resolvable or not, with its MDE.
* `runtime_table` (paper 000, Table 2): step time × steps without the KL monitors, like with like.
* `peak_final_table` (paper 001, Table 3): held-out primary metric at its peak snapshot and at the end.
* `avg_columns` (paper 002, Tables 3/5/6; paper 003): the Avg of the benchmarks' headline metrics per cell, their
  plain mean or (`eval.average: samples`, paper 002) the accuracy over all generated samples.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from lorarl.report import bounds, stats
from lorarl.report.columns import baseline_text, is_baseline_row
from lorarl.report.data import StudyData, scores_matrix
from lorarl.language.study import every_cell, label_of, study_cells

NON_EVAL = {"final_train_reward": "final train reward", "mean_step_time_s": "step time (s)"}


def _groups(data: StudyData) -> list[tuple[dict, list[str]]]:
    keys = data.keys
    if data.cells.empty:
        return []
    if not keys:
        return [({}, list(data.cells["cell"]))]
    out = []
    for labels, g in data.cells.groupby(keys, sort=False):
        labels = labels if isinstance(labels, tuple) else (labels,)
        out.append((dict(zip(keys, map(str, labels))), list(g["cell"])))
    return out


def _seed_labels(data: StudyData, ids: list[str]) -> tuple:
    """The seed-axis labels of some cells, in their order (a row's seeds: pairing with its baseline's)."""
    axis = data.study.seed_axis
    if not axis or axis not in data.cells:
        return tuple(ids)  # no seed axis: nothing to pair on but the cell itself
    by_cell = data.cells.set_index("cell")[axis]
    return tuple(str(by_cell.at[c]) for c in ids)


def baseline_key(data: StudyData, labels: dict) -> tuple | None:
    """The labels of a row's baseline row (None without a study baseline)."""
    b = data.study.baseline
    if not b:
        return None
    return tuple(label_of(b[k]) if k in b else labels[k] for k in data.keys)


def baseline_label(data: StudyData) -> str:
    return ", ".join(f"{v}" for v in (data.study.baseline or {}).values())


def primary_metrics(data: StudyData) -> list[str]:
    from lorarl.report.columns import headlines, primary_columns

    return primary_columns(data.cells, headlines(data.study)) if not data.cells.empty else []


def _bounds(data: StudyData, col: str, ids: list[str], vals) -> bounds.Bounds | None:
    """The range of a row's column (lorarl.report.bounds: the train reward's from its cells' reward settings)
    unless one of its values lies outside it."""
    want = set(ids)
    cfgs = [c.config for c in every_cell(data.study) if c.id in want] if col == "final_train_reward" else []
    return bounds.consistent(bounds.column_bounds(col, cfgs), vals)


def stats_table(data: StudyData) -> pd.DataFrame:
    """Long table: one row per (group, metric) with mean, sd, ci_low, ci_high, n_seeds, n_problems, `interval`
    (how the interval was computed), is_baseline and, against the baseline, diff, diff_low, diff_high, mde,
    resolvable and the formatted `text`. Its own column names are reserved (lorarl.language.reserved): an axis can
    never overwrite them, nor they an axis label."""
    groups = _groups(data)
    rows: list[dict] = []
    estimates: dict[tuple, dict[str, stats.Estimate]] = {}
    for col in primary_metrics(data):
        bench, metric = col.split("/")  # each problem scored by the column's own metric
        finished = [c for c in data.cells["cell"] if pd.notna(data.cells.set_index("cell").at[c, col])]
        common = scores_matrix(data, finished, bench, metric)
        for labels, ids in groups:
            ids = [c for c in ids if c in finished]
            if not ids:
                continue
            m = scores_matrix(data, ids, bench, metric) if common is not None else None
            if m is not None and m[1] == common[1]:
                est = stats.two_level(m[0], seeds=_seed_labels(data, ids))
                est.lo, est.hi = bounds.clip(est.lo, est.hi, (0.0, 1.0))
                interval = "seeds x problems" if est.n_seeds > 1 else "problems only (one seed)"
            else:
                vals = data.cells.set_index("cell").loc[ids, col].astype(float).to_numpy()
                est = stats.t_interval(vals, bounds=_bounds(data, col, ids, vals))
                interval = "t over seeds"
            estimates.setdefault(tuple(labels.values()), {})[col] = est
            rows.append({**labels, "metric": col, "interval": interval, "est": est})
    for col in NON_EVAL:
        if col not in data.cells:
            continue
        for labels, ids in groups:
            vals = data.cells.set_index("cell").loc[ids, col].astype(float).to_numpy()
            est = stats.t_interval(vals, bounds=_bounds(data, col, ids, vals))
            estimates.setdefault(tuple(labels.values()), {})[col] = est
            rows.append({**labels, "metric": col, "interval": "t over seeds", "est": est})
    out = []
    for r in rows:
        est: stats.Estimate = r.pop("est")
        labels = {k: r[k] for k in data.keys}
        row = {**r, "mean": est.mean, "sd": est.sd, "ci_low": est.lo, "ci_high": est.hi,
               "n_seeds": est.n_seeds, "n_problems": est.n_problems, "is_baseline": is_baseline_row(data.study, labels)}
        text = stats.fmt_estimate(est, 3)
        bkey = baseline_key(data, labels)
        if bkey is not None and bkey != tuple(labels.values()) and r["metric"] in estimates.get(bkey, {}):
            cmp = stats.compare(est, estimates[bkey][r["metric"]])
            row.update(diff=cmp.diff, diff_low=cmp.lo, diff_high=cmp.hi, mde=cmp.mde, paired_on=cmp.pairing,
                       resolvable=cmp.resolvable if not math.isnan(cmp.mde) else None)
            text += "  " + stats.fmt_comparison(cmp, baseline_label(data), 3)
        elif bkey is not None and bkey == tuple(labels.values()):
            text += "  (baseline)"
        row["text"] = text
        out.append(row)
    return pd.DataFrame(_with_censored(data, out))


def _with_censored(data: StudyData, rows: list[dict]) -> list[dict]:
    """A setting an adaptive study's search stopped: one row per headline metric saying where it was censored
    (its metric at the last step is unobserved: no mean, no interval); every row in the study's setting order."""
    cen = data.censored
    keys = data.keys
    if cen.empty:
        return rows
    have = {tuple(str(r[k]) for k in keys) for r in rows}
    for labels, g in (cen.groupby(keys, sort=False) if keys else [((), cen)]):
        labels = tuple(map(str, labels if isinstance(labels, tuple) else (labels,)))
        if labels in have:
            continue
        lab = dict(zip(keys, labels))
        step = int(g["stopped_at_step"].max())
        for col in primary_metrics(data):
            rows.append({**lab, "metric": col, "interval": "censored", "mean": math.nan, "sd": math.nan,
                         "ci_low": math.nan, "ci_high": math.nan, "n_seeds": 0, "n_problems": 0,
                         "is_baseline": is_baseline_row(data.study, lab), "censored_at_step": step,
                         "text": f"censored at step {step} (stopped by the search; {len(g)} cells)"})
    order = {tuple(c.axes[k] for k in keys): i for i, c in reversed(list(enumerate(study_cells(data.study))))}
    return sorted(rows, key=lambda r: order.get(tuple(str(r[k]) for k in keys), len(order)))


def stats_markdown(data: StudyData, table: pd.DataFrame) -> str:
    """One column per metric, one row per group; the method in the caption."""
    keys = data.keys
    lines = [f"# {data.study.name}: headline metrics with uncertainty", "",
             f"Caption: {stats.METHOD}." + (f" Baseline: {baseline_text(data.study.baseline)}." if data.study.baseline else ""), ""]
    if table.empty:
        return "\n".join(lines + ["(no finished cells yet)"]) + "\n"
    metrics = list(dict.fromkeys(table["metric"]))
    head = (keys or ["cells"]) + [NON_EVAL.get(m, m.replace("/", " ")) for m in metrics]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups = table.groupby(keys, sort=False) if keys else [((), table)]
    for labels, g in groups:
        labels = labels if isinstance(labels, tuple) else (labels,)
        by = dict(zip(g["metric"], g["text"]))
        head_vals = [str(v) for v in labels] or ["all"]
        lines.append("| " + " | ".join([*head_vals, *(by.get(m, "–") for m in metrics)]) + " |")
    return "\n".join(lines) + "\n"


def per_cell_runtime(data: StudyData) -> pd.DataFrame:
    """Per cell (index): training steps, mean time of a training step (`time/step_s`, KL monitors excluded,
    else `step_time_s`), train_min = the two multiplied, and the monitors' summed seconds.

    A row's ``step`` is a training step (``train.steps``' unit); the trainer logs `time/step_s` per
    optimiser update (a row holds their mean), so with ``updates_per_step`` updates (PPO mini-batches x
    epochs) a training step takes that many times a row's `time/step_s`. `step_time_s` is already per
    training step."""
    c = data.curves
    if c.empty:
        return pd.DataFrame()
    step_col = "time/step_s" if "time/step_s" in c else "step_time_s"
    mon = [m for m in ("time/kl_monitor_s", "time/kl_new_old_s", "time/startup_s") if m in c]  # + jobs' start-up
    per = c.groupby("cell", sort=False).agg(steps=("step", "max"), step_s=(step_col, "mean"),
                                            **{m.split("/")[-1]: (m, "sum") for m in mon})
    if step_col == "time/step_s":
        updates = {cell.id: cell.config.train.updates_per_step for cell in every_cell(data.study)}
        per["step_s"] = per["step_s"] * pd.Series([updates.get(i, 1) for i in per.index], index=per.index)
    per["train_min"] = per["step_s"] * per["steps"] / 60.0
    return per


def runtime_table(data: StudyData) -> pd.DataFrame:
    """Paper 000 Table 2's runtime column, like with like: mean step time (the trainer's `time/step_s`,
    which excludes the KL monitors, else the recorder's `step_time_s`) × steps, per cell; then mean ± sd
    over seeds per group, and the monitors' own time and the jobs' start-up (`startup_s_total_s`: grading workers,
    engine; in no step's time) separately."""
    per = per_cell_runtime(data)
    if per.empty:
        return pd.DataFrame()
    mon = [m for m in ("time/kl_monitor_s", "time/kl_new_old_s", "time/startup_s") if m in data.curves]
    per = per.join(data.cells.set_index("cell")[data.keys]) if data.keys else per
    keys = data.keys
    if not keys:
        per = per.assign(_all="all")
        keys = ["_all"]
    g = per.groupby(keys, sort=False)
    agg = stats.mean_sd(per, keys, ["step_s", "train_min"])
    for m in mon:
        agg[m.split("/")[-1] + "_total_s"] = g[m.split("/")[-1]].mean()
    agg["n_seeds"] = agg.pop("n_seeds")  # last, as before
    return agg.reset_index().drop(columns=["_all"], errors="ignore")


def peak_final_table(data: StudyData) -> pd.DataFrame:
    """Paper 001 Table 3: per group and curve benchmark, the primary metric at its peak step (per cell,
    then mean ± sd over seeds) and at the final step, with the peak step; needs eval_every snapshots. A cell
    with no evaluation at its last step (an adaptive study's search stopped it at a rung: censored) has no
    final value, never its last rung's; its peak is over the snapshots it reached."""
    ev = data.evcurves
    if ev.empty:
        return pd.DataFrame()
    last = {c.id: c.config.train.steps for c in every_cell(data.study)}
    rows = []
    for (cell, bench), g in ev.groupby(["cell", "benchmark"], sort=False):
        g = g.sort_values("step")
        i = int(np.argmax(g["value"].to_numpy()))
        end = g["value"][g["step"] == last.get(cell)]
        rows.append({"cell": cell, "benchmark": bench, **{k: g[k].iloc[0] for k in data.keys},
                     "peak": g["value"].iloc[i], "peak_step": int(g["step"].iloc[i]),
                     "final": end.iloc[-1] if len(end) else math.nan})
    df = pd.DataFrame(rows)
    keys = data.keys + ["benchmark"]
    out = stats.mean_sd(df, keys, ["peak", "final", "peak_step"])
    out["drop"] = out["peak_mean"] - out["final_mean"]
    out["n_seeds"] = out.pop("n_seeds")  # last, as before
    return out.reset_index()


# eval.average -> the label of the report's Avg (the avg table's and the base table's titles)
AVERAGES = {"benchmarks": "the plain mean of the benchmarks' headline columns (paper 003's Avg)",
            "samples": "the accuracy over all generated samples, each benchmark's column weighted by its problems × "
                       "samples per problem (paper 002's Avg, Tables 3, 5 and 6)"}


def average_of(study: Any) -> str:
    """How the study's Avg averages its benchmarks (``eval.average``: ``benchmarks`` or ``samples``)."""
    ev = [getattr(c.config, "eval", None) for c in study_cells(study)]  # a toy cell has no evaluation
    return next((e.average for e in ev if e is not None), "benchmarks")


def avg_label(study: Any) -> str:
    """The report's label of the study's Avg column: what it is and the setting that chose it."""
    how = average_of(study)
    return f"{AVERAGES[how]}; eval.average: {how}"


def avg_weights(data: StudyData, cols: list[str], frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cell of ``frame`` (index; default the study's cells, or its base rows) and headline column, the weight of that column in the cell's Avg: 1 each for the plain
    mean (``eval.average: benchmarks``); for ``samples`` (paper 002: the accuracy over all generated samples) the
    benchmark's problems x samples per problem: the problems its evaluation counted (``<b>/n_problems``, else
    the registry's count at its pinned revision, cut to ``limit``) times the protocol's n in the cell's plan."""
    from lorarl.language.evalplan.plan import benchmark_specs, protocol_for
    from lorarl.grading.benchmarks import get_benchmark

    from lorarl.language.study import base_cells

    cells = (data.cells if frame is None else frame).set_index("cell")
    if average_of(data.study) != "samples":
        return pd.DataFrame(1.0, index=cells.index, columns=cols)
    configs = {c.id: c.config for c in study_cells(data.study)} | {b.id: b.config for b in base_cells(data.study)}
    default = next(iter(configs.values()))
    out = pd.DataFrame(index=cells.index, columns=cols, dtype=float)
    for cell in cells.index:
        cfg = configs.get(cell, default)  # a seed an adaptive hypothesis added: its setting's plan
        specs = benchmark_specs(cfg)
        for col in cols:
            bench = col.split("/")[0]
            if bench not in specs:  # this cell does not evaluate it: no weight (its Avg stays empty)
                continue
            counted = cells.at[cell, f"{bench}/n_problems"] if f"{bench}/n_problems" in cells else math.nan
            registry = get_benchmark(bench).n_problems or math.nan
            limit = specs[bench].limit
            problems = counted if pd.notna(counted) else (min(registry, limit) if limit else registry)
            out.at[cell, col] = float(problems) * protocol_for(bench, specs[bench], cfg.eval).n
    return out


def avg_series(data: StudyData, cells: pd.DataFrame, cols: list[str]) -> tuple[pd.Series, str]:
    """Each cell's Avg of the headline columns ``cols`` (weighted by :func:`avg_weights`) and how it was taken."""
    w = avg_weights(data, cols, cells).reindex(cells["cell"]).set_axis(cells.index)
    avg = (cells[cols].astype(float) * w).sum(axis=1, min_count=len(cols)) / w.sum(axis=1)
    avg = avg.where(cells[cols].notna().all(axis=1))
    if average_of(data.study) != "samples":
        return avg, "plain mean of " + ", ".join(cols)
    first = w.iloc[0] if len(w) else pd.Series(dtype=float)
    parts = [f"{c.split('/')[0]} {first[c]:g}" for c in cols] if len(w) else list(cols)
    return avg, "accuracy over all samples: each column weighted by problems x samples (" + ", ".join(parts) + ")"


def avg_columns(data: StudyData) -> pd.DataFrame:
    """Papers 002/003's Avg column: per cell the Avg of every benchmark's headline metric (only when a study has
    two or more benchmarks; ``eval.average``: their plain mean, or paper 002's accuracy over all generated
    samples, :func:`avg_weights`), then mean ± sd over seeds per group, with trainable params; ``avg_weights``
    says how the Avg was taken."""
    cols = primary_metrics(data)
    if len(cols) < 2:
        return pd.DataFrame()
    avg, how = avg_series(data, data.cells, cols)
    cells = data.cells.assign(avg=avg)
    keys = data.keys or []
    if not keys:
        cells = cells.assign(_all="all")
        keys = ["_all"]
    vals = [*cols, "avg"] + [c for c in ("params_trainable", "trainable_fraction") if c in cells]
    out = stats.mean_sd(cells, keys, vals)
    return out.reset_index().drop(columns=["_all"], errors="ignore").assign(avg_weights=how)
