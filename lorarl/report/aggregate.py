"""Tables (mean ± sd over seeds) and figures of a study, read from the per-cell files only."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from lorarl import paths
from lorarl.report import readcache
from lorarl.report.columns import eval_metrics, is_baseline_row
from lorarl.report.stats import mean_sd
from lorarl.numerics.divergence import DIVERGED, cell_state
from lorarl.report.rows import base_row, eval_columns, eval_curve_table, with_axes
from lorarl.language.study import Study, base_cells, study_cells

METRICS = {  # column -> human label, in table order
    "final_train_reward": "final train reward",
    # evaluation columns `<benchmark>/<metric>` (pass@1; avg@n, pass@k) come here, in study order
    "wall_time_s": "train wall time (s)",
    "mean_step_time_s": "step time (s)",
    "trainable_fraction": "trainable fraction",
}


def _read_json(p: Path) -> dict:
    return json.loads(p.read_text())


def _cells(study: Study, results: str | Path) -> list:
    """The study's cells and the seeds a hypothesis added (lorarl.report.adaptive), censored ones left out."""
    from lorarl.report.adaptive import censored, report_cells
    from lorarl.language.study import cell_table as study_table

    table = study_table(study)
    stopped = censored(study, table, results)
    return [c for c in report_cells(study, table, results) if c.id not in stopped]


def cell_table(study: Study, results: str | Path) -> pd.DataFrame:
    """One row per cell: axis labels + train summary + every benchmark's final evaluation; a cell an adaptive
    study's search stopped: state `stopped` and the step it was censored at, no metric (docs/adaptive.md)."""
    from lorarl.report.adaptive import censored_rows, report_cells
    from lorarl.language.study import cell_table as study_table

    rows = []
    for cell in _cells(study, results):
        kw = dict(results=results, study=study.name, cell=cell.id)
        s = _read_json(paths.path("summary", **kw))
        rows.append({
            "cell": cell.id, **cell.axes,
            "state": cell_state(s), "diverged_at_step": s.get("diverged_at_step"),  # lorarl.numerics.divergence
            **{k: s.get(k) for k in ("final_train_reward", "wall_time_s", "mean_step_time_s",
                                     "trainable_fraction")},
            **eval_columns(results, study.name, cell.id, cell.config),
        })
    order = {c.id: i for i, c in enumerate(report_cells(study, study_table(study), results))}
    rows += censored_rows(study, study_table(study), results)
    return pd.DataFrame(sorted(rows, key=lambda r: order.get(r["cell"], len(order))))  # the study's cell order


def base_table(study: Study, results: str | Path) -> pd.DataFrame:
    """One row per base pseudo-cell (the untrained model of each model and prompt)."""
    rows = [{**base_row(b), **eval_columns(results, study.name, b.id, b.config, is_base=True)}
            for b in base_cells(study)]
    return pd.DataFrame(rows)


def _metric_order(cells: pd.DataFrame) -> list[str]:
    """Train reward, then the evaluation columns, then cost columns."""
    head = [m for m in METRICS if m in cells]
    return head[:1] + eval_metrics(cells) + head[1:]


def group_axes(study: Study) -> list[str]:
    return [a for a in study.axes if a != study.seed_axis]


def seed_table(study: Study, cells: pd.DataFrame) -> pd.DataFrame:
    """Mean and sd over the seed axis, grouped by every other axis (axis order kept)."""
    keys = group_axes(study)
    metrics = _metric_order(cells)
    if not keys:
        cells = cells.assign(_all="all")
        keys = ["_all"]
    from lorarl.report.adaptive import STOPPED

    order = {k: {lab: i for i, lab in enumerate(dict.fromkeys(cells[k]))} for k in keys}
    stopped = cells[cells["state"].eq(STOPPED)] if "state" in cells else cells.iloc[:0]
    cells = cells.drop(stopped.index)  # censored: no metric observed, never in a mean
    out = mean_sd(cells, keys, metrics) if not cells.empty else mean_sd(stopped, keys, [])
    if "state" in cells:  # diverged cells are counted (their metrics up to the divergence stay in the means)
        out = out.join(cells.assign(_div=cells["state"].eq(DIVERGED)).groupby(keys, sort=False)["_div"].sum()
                       .rename("n_diverged"))
    if not stopped.empty:  # a setting the search stopped: a row of its own, n_seeds 0, censored at its rung
        g = stopped.groupby(keys, sort=False)
        extra = g.size().rename("n_stopped").to_frame().join(g["stopped_at_step"].max())
        out = out.join(extra, how="outer")
        out["n_seeds"] = out["n_seeds"].fillna(0).astype(int)
        for col in ("n_diverged", "n_stopped"):
            if col in out:
                out[col] = out[col].fillna(0).astype(int)
    out = out.reset_index()
    out = out.sort_values(keys, key=lambda col: col.map(order[col.name])).reset_index(drop=True)
    if study.baseline:  # the rows the stats table compares the others with
        out["is_baseline"] = [is_baseline_row(study, {k: r[k] for k in keys}) for _, r in out.iterrows()]
    return out.drop(columns=["_all"], errors="ignore")


def markdown(study: Study, table: pd.DataFrame, base: pd.DataFrame | None = None,
             cells: pd.DataFrame | None = None) -> str:
    keys = [k for k in group_axes(study) if k in table]
    metrics = [m for m in _metric_order(table.rename(columns=lambda c: str(c).removesuffix("_mean")))
               if f"{m}_mean" in table]
    head = (keys or ["cells"]) + [METRICS.get(m, m.replace("/", " ")) for m in metrics] + ["seeds"]
    lines = [f"# {study.name}: mean ± sd over `{study.seed_axis}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, b in (base if base is not None else pd.DataFrame()).iterrows():  # the untrained model first
        first = b["base"] if "base" in b and pd.notna(b["base"]) else f"base ({b['model']})"
        vals = [first] + [str(b[k]) if k in b and pd.notna(b[k]) else "–" for k in keys[1:]]  # its prompt's labels
        vals += [f"{b[m]:.3f}" if m in b and pd.notna(b[m]) else "–" for m in metrics] + ["–"]
        lines.append("| " + " | ".join(vals) + " |")
    for _, r in table.iterrows():
        vals = [str(r[k]) for k in keys] or ["all"]
        if bool(r.get("is_baseline", False)):  # marked at the first axis the baseline names
            i = keys.index(next(k for k in study.baseline if k in keys))
            vals[i] += " (baseline)"
        for m in metrics:
            mu, sd = r[f"{m}_mean"], r[f"{m}_sd"]
            if pd.isna(mu):
                vals.append("–")
                continue
            fmt = "{:.3g}" if m == "trainable_fraction" else ("{:.1f}" if "time" in m else "{:.3f}")
            vals.append(fmt.format(mu) + ("" if pd.isna(sd) else " ± " + fmt.format(sd)))
        n_div, n_stop = int(r.get("n_diverged", 0) or 0), int(r.get("n_stopped", 0) or 0)
        vals.append(str(int(r["n_seeds"])) + (f" ({n_div} diverged)" if n_div else "")
                    + (f" ({n_stop} stopped at step {int(r['stopped_at_step'])}: censored)" if n_stop else ""))
        lines.append("| " + " | ".join(vals) + " |")
    notes = diverged_notes(cells) if cells is not None else []
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def diverged_notes(cells: pd.DataFrame) -> list[str]:
    """One line per diverged cell (lorarl.numerics.divergence): where it stopped."""
    if "state" not in cells:
        return []
    rows = cells[cells["state"] == DIVERGED]
    return [f"- `{r['cell']}` diverged at step {int(r['diverged_at_step'])} (NaN/inf): metrics up to there, "
            f"adapter = last finite weights" for _, r in rows.iterrows()]


def metric_curves(study: Study, results: str | Path) -> pd.DataFrame:
    frames = []
    for cell in _cells(study, results):
        df = readcache.read_csv(paths.path("metrics", results=results, study=study.name, cell=cell.id))
        frames.append(with_axes(df, cell))
    return pd.concat(frames, ignore_index=True)


def aggregate(study: Study, results: str | Path = "results") -> dict[str, Path]:
    from lorarl.report import plots

    tdir = paths.path("table_csv", results=results, study=study.name).parent
    fdir = paths.path("figures", results=results, study=study.name)
    tdir.mkdir(parents=True, exist_ok=True)
    fdir.mkdir(parents=True, exist_ok=True)
    cells = cell_table(study, results)
    table = seed_table(study, cells)
    out = {
        "cells_csv": tdir / "cells.csv",
        "table_csv": paths.path("table_csv", results=results, study=study.name),
        "table_md": paths.path("table_md", results=results, study=study.name),
    }
    base = base_table(study, results)
    cells.to_csv(out["cells_csv"], index=False)
    table.to_csv(out["table_csv"], index=False)
    base.to_csv(tdir / "base.csv", index=False)
    out["table_md"].write_text(markdown(study, table, base, cells))
    curves = metric_curves(study, results)
    from lorarl.report.draw import reset_palette

    reset_palette(study)  # one colour per group in every figure of the study
    out.update(plots.study_figures(study, cells, curves, fdir, base=base))
    evcurves = eval_curve_table(study, results)
    if not evcurves.empty:
        out["eval_curves_csv"] = paths.path("eval_curves", results=results, study=study.name)
        evcurves.to_csv(out["eval_curves_csv"], index=False)
        out.update(plots.eval_curve_figures(study, evcurves, base, fdir))
    diag = diagnostics_table(study, results)
    if not diag.empty:
        summary = diag[diag["index"] == 0].pivot_table(index=group_axes(study) or None, columns="metric",
                                                       values="value", aggfunc="mean", sort=False)
        summary.to_csv(tdir / "diagnostics.csv")
        fig = plots.diagnostics_figure(study, diag, fdir / "diagnostics.png")
        if fig:
            out["diagnostics"] = fig
    return out


def diagnostics_table(study: Study, results: str | Path) -> pd.DataFrame:
    """All cells' diagnostics.parquet (long format) with the cell's axis labels attached."""
    frames = []
    for cell in _cells(study, results):
        p = paths.path("diagnostics", results=results, study=study.name, cell=cell.id)
        if p.exists():
            frames.append(readcache.read_parquet(p).assign(cell=cell.id, **cell.axes))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
