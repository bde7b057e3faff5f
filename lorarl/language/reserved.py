"""Column names the report puts beside a study's axis columns: no axis may be named like one.

Every table, CSV and frame of the report (lorarl/report) holds one column per axis, named after the axis,
next to its own columns. An axis named like one of those would overwrite it (or be overwritten) row by
row: a `method` axis once lost its labels to the stats table's interval-method column. ``lorarl.language.study``
refuses such an axis name at load (exit 2, naming the axis and these names). Names with a `/` (evaluation
columns `<benchmark>/<metric>`, flags `flag/<name>`, training metrics such as `kl_ref/k3`) and names
starting with `_` cannot be axis names, so they need no entry here. A training metric without a `/` that the
report does not read by name (e.g. lorarl's `kl` term beside paper 000's `kl` axis) is moved aside to
`train/<name>` in the report's curves instead (lorarl.report.rows.with_axes).

`tests/report/test_report_shapes.py` runs the report on synthetic studies and fails on any column of any table,
CSV or frame that is neither an axis, nor a `/` or `_` name, nor listed here.
"""

from __future__ import annotations

# per-cell rows (lorarl.report.data / aggregate): summary.json fields and the cell's state
CELL = ("cell", "state", "diverged_at_step", "final_train_reward", "wall_time_s", "mean_step_time_s",
        "trainable_fraction", "params_trainable", "params_total", "mask_density", "base", "role")
# summary table (mean ± sd over seeds) and the papers' tables (lorarl.report.tables, fig_kl, masks)
SUMMARY = tuple(f"{m}_{s}" for m in ("final_train_reward", "wall_time_s", "mean_step_time_s", "trainable_fraction",
                                      "params_trainable", "params_total", "mask_density", "step_s", "train_min",
                                      "peak", "final", "peak_step", "avg")
                for s in ("mean", "sd")) + (
    "n_seeds", "n_diverged", "is_baseline", "steps", "step_s", "train_min", "kl_monitor_s", "kl_new_old_s",
    "kl_monitor_s_total_s", "kl_new_old_s_total_s", "startup_s",
    "startup_s_total_s", "peak", "peak_step", "final", "drop", "avg", "kl_term", "avg_weights")
# stats table (lorarl.report.tables.stats_table)
STATS = ("metric", "interval", "mean", "sd", "ci_low", "ci_high", "n_problems", "diff", "diff_low", "diff_high",
         "mde", "paired_on", "resolvable", "text")
# long frames: held-out curves, diagnostics, figure CSVs
LONG = ("benchmark", "step", "update", "value", "matrix", "index", "group", "series", "std", "count", "pct",
        "kl_metric", "window_steps", "kl_mean", "kl_sd", "reward_mean", "reward_sd", "x", "acc")
# training metrics the report reads by name (metrics.csv)
TRAIN = ("reward", "accuracy", "grad_norm", "kl_new_old", "frac_truncated", "step_time_s", "ppo_kl")
# weight-space diagnostics (lorarl.diagnose.weights): tables/diagnostics.csv has one column per metric
DIAG = ("spectral_drift", "rel_update_fro", "max_angle_left_deg", "max_angle_right_deg", "bf16_sparsity",
        "subspace_sim_top", "subspace_sim_bottom", "overlap_principal", "overlap_principal_baseline",
        "overlap_low_magnitude", "overlap_low_magnitude_baseline", "overlap_principal_not_low",
        "overlap_principal_not_low_baseline", "sigma_base", "sigma_tuned", "cos_left", "cos_right", "update_c",
        "update_p", "update_cum_energy", "product_update_c", "product_update_p", "product_update_cum_energy",
        "subspace_sim_top_step", "subspace_sim_bottom_step", "layer")

# adaptive studies (lorarl.report.adaptive): censored cells, the search's and the hypotheses' tables
ADAPTIVE = ("stopped_at_step", "n_stopped", "censored_at_step", "setting", "decision", "cell_steps", "hypothesis",
            "kind", "setting_a", "setting_b", "margin", "estimate", "seeds_used", "max_seeds", "fixed_cell_steps",
            "n_cells", "hash_ties")

REPORT_COLUMNS: frozenset[str] = frozenset(CELL + SUMMARY + STATS + LONG + TRAIN + DIAG + ADAPTIVE)


def check_axis_name(name: str) -> str | None:
    """Why ``name`` cannot be an axis name (it is a column of the report), or None."""
    if name in REPORT_COLUMNS:
        return (f"axis name {name!r} is a column the report adds beside the axis columns (its tables, CSVs "
                f"and figures would mix the two); allowed: any other name; reserved: "
                f"{', '.join(sorted(REPORT_COLUMNS))}")
    return None
