"""Paper 004 Tables 4-5 for sparse-mask studies (cells with ``adapter.mask``): per setting, each benchmark's
held-out headline metric, their Average and the mask density over the linear layers (the paper's "#params":
"parameter counts shown are for linear layers only, excluding the embedding and head layers"), one table per
``eval.eval_every`` snapshot step (Table 4 reads step 320) and one at the final step (Table 5, step 500).

The density is the one the cell trained with, as its adapter fingerprint recorded it at build time
(summary.json ``adapter.structure.masks``: trained entries / entries of the masked matrices, which are every
linear layer but the output head under ``target_modules: all-linear``); a cell without a mask that fine-tunes
every weight (dense) is 1.0.
"""

from __future__ import annotations

import pandas as pd

from lorarl.report.columns import is_baseline_row
from lorarl.report.data import StudyData
from lorarl.report.stats import mean_sd
from lorarl.language.study import every_cell, study_cells


def is_mask_study(data: StudyData) -> bool:
    return any(getattr(c.config.adapter, "mask", None) for c in study_cells(data.study))


def mask_density(data: StudyData) -> pd.Series:
    """Per finished cell (index): the trained fraction of its masked linear layers (1.0 dense, NaN otherwise)."""
    methods = {c.id: c.config.adapter.method for c in every_cell(data.study)}
    out = {}
    for cell, s in data.summaries.items():
        masks = ((s.get("adapter") or {}).get("structure") or {}).get("masks")
        out[cell] = float(masks["density"]) if masks else (1.0 if methods.get(cell) == "full" else float("nan"))
    return pd.Series(out, name="mask_density", dtype=float)


def _table(data: StudyData, values: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """Per group of ``values`` (one row per cell: axes, ``cols``, mask_density): mean ± sd over seeds, the
    Average over ``cols`` (per cell, then over seeds) and the density, baseline rows marked."""
    values = values.assign(avg=values[cols].mean(axis=1, skipna=False))
    keys = data.keys or ["_all"]
    if not data.keys:
        values = values.assign(_all="all")
    out = mean_sd(values, keys, [*cols, "avg", "mask_density"]).reset_index()
    if data.study.baseline:
        out["is_baseline"] = [is_baseline_row(data.study, {k: r[k] for k in data.keys}) for _, r in out.iterrows()]
    return out.drop(columns=["_all"], errors="ignore")


def mask_tables(data: StudyData) -> dict[str, pd.DataFrame]:
    """``{name: table}``: ``masks_step<S>`` per snapshot step S, then ``masks_final``; empty without masks."""
    from lorarl.report.tables import primary_metrics

    if data.cells.empty or not is_mask_study(data):
        return {}
    density = mask_density(data)
    cells = data.cells.set_index("cell").join(density)
    out: dict[str, pd.DataFrame] = {}
    ev = data.evcurves
    final = {c.id: c.config.train.steps for c in every_cell(data.study)}
    if not ev.empty:
        snaps = ev[ev["step"] != ev["cell"].map(final)]
        for step, g in snaps.groupby("step", sort=True):
            wide = g.pivot_table(index="cell", columns="benchmark", values="value", aggfunc="first", sort=False)
            metric = g.groupby("benchmark", sort=False)["metric"].first()
            wide.columns = [f"{b}/{metric[b]}" for b in wide.columns]
            vals = wide.join(cells[[*data.study.axes, "mask_density"]]).reset_index()
            out[f"masks_step{int(step)}"] = _table(data, vals, list(wide.columns))
    cols = primary_metrics(data)
    out["masks_final"] = _table(data, cells[[*data.study.axes, *cols, "mask_density"]].reset_index(), cols)
    return out


def titles(data: StudyData, tables: dict[str, pd.DataFrame]) -> dict[str, str]:
    """The report's heading of each table."""
    last = max((c.config.train.steps for c in study_cells(data.study)), default=0)
    out = {}
    for name in tables:
        when = f"step {name.removeprefix('masks_step')}" if name != "masks_final" else f"the final step ({last})"
        paper = "Table 4 reads step 320 of 500" if name != "masks_final" else "Table 5: step 500"
        out[name] = (f"held-out at {when}, Average and mask density over the linear layers (paper 004, {paper}; "
                     f"its #params column is mask_density)")
    return out
