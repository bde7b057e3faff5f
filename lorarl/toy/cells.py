"""The toy KL-bound study through the normal pipeline: cells, per-cell files, MLflow, aggregate.

Each (rank, seed) cell costs ~0.1 s, so one job runs every cell of the study in a single process
(one Python + torch start-up for all), sharing the pretrained base, and still writes one folder
and one MLflow run per cell. Rerunning one cell reruns this batch (about twenty seconds).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lorarl import paths
from lorarl.io import write_json as _write_json
from lorarl.language.study import Study, study_cells
from lorarl.language.toy import ToyCellConfig


def run_toy_study(study: Study, results: str | Path = "results", cells: list[str] | None = None) -> list[dict]:
    """Run the given cells (default: all) in this process; one folder + one MLflow run each."""
    from tqdm import tqdm

    from lorarl.toy.kl_bound import _pretrain_fields, load_base, pretrain, run_one, save_base
    from lorarl.tracking.client import Tracker

    todo = [c for c in study_cells(study) if cells is None or c.id in cells]
    tracker = Tracker(results, study.name)
    bases: dict[str, dict] = {}
    out = []
    for cell in tqdm(todo, desc=f"{study.name} cells", mininterval=2):
        cfg: ToyCellConfig = cell.config
        key = json.dumps(_pretrain_fields(cfg.toy), sort_keys=True)  # fine-tuning knobs share a base
        if key not in bases:  # pretraining is shared by every cell with the same toy settings
            cache = Path(results) / study.name / ".base" / f"{hashlib.sha1(key.encode()).hexdigest()[:12]}.pt"
            bases[key] = load_base(cache, cfg.toy) if cache.exists() else pretrain(cfg.toy)
            if not cache.exists():
                save_base(bases[key], cache)
        t0 = time.perf_counter()
        row = run_one(cfg.toy, bases[key], cfg.rank, cfg.seed)
        row["wall_time_s"] = time.perf_counter() - t0
        row["bound_holds"] = bool(row["kl"] <= row["bound"] and row["kl_max"] <= row["bound"])
        run_id = tracker.start(cell.id, run_name=cell.id,
                               tags={"lorarl.config_hash": cell.hash, **{f"axis.{k}": v for k, v in cell.axes.items()}},
                               params=cell.flat_config())
        tracker.log_summary({k: float(v) for k, v in row.items() if isinstance(v, (int, float))})
        tracker.finish()
        kw = dict(results=results, study=study.name, cell=cell.id)
        _write_json(paths.path("cell_json", **kw), {"id": cell.id, "axes": cell.axes, "hash": cell.hash,
                                                     "config": cfg.model_dump(mode="json")})
        _write_json(paths.path("summary", **kw), {**row, "cell": cell.id, "config_hash": cell.hash,
                                                   "mlflow_run_id": run_id})
        out.append(row)
    return out


def rank_trend(table: pd.DataFrame) -> dict:
    """Does the seed-mean KL rise with rank? `rises` = strictly increasing from each rank to the
    next; `slope` = least-squares slope of log KL on log r (the paper's √r would be 0.5 in μ)."""
    t = table.sort_values("rank")
    kl = t["kl_mean"].to_numpy(dtype=float)
    r = t["rank"].to_numpy(dtype=float)
    ok = kl > 0
    slope = float(np.polyfit(np.log(r[ok]), np.log(kl[ok]), 1)[0]) if ok.sum() >= 2 else float("nan")
    return {"rises": bool(len(kl) >= 2 and (np.diff(kl) > 0).all()), "slope": slope,
            "ratio": float(kl[-1] / kl[0]) if kl[0] > 0 else float("nan")}


def aggregate_toy(study: Study, results: str | Path = "results") -> dict[str, Path]:
    """Per setting (every non-rank, non-seed axis) and rank: mean ± sd over seeds; per setting
    whether the KL rises with rank and whether the bound holds in every seed; the figure (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for cell in study_cells(study):
        s = json.loads(paths.path("summary", results=results, study=study.name, cell=cell.id).read_text())
        rows.append({"cell": cell.id, **cell.axes, **s})
    cells = pd.DataFrame(rows)
    setting_axes = [a for a in study.axes if a not in ("rank", study.seed_axis)]
    cells["setting"] = (cells[setting_axes].astype(str).agg("-".join, axis=1) if setting_axes
                        else "default")
    keys = ["setting", "rank"]
    g = cells.groupby(keys, sort=False)[["kl", "kl_max", "bound", "mu"]]
    table = g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_sd")).join(g.size().rename("n_seeds"))
    table = table.join(cells.groupby(keys, sort=False)["bound_holds"].all()).reset_index()
    order = list(dict.fromkeys(cells["setting"]))
    table["_o"] = table["setting"].map(order.index)
    table = table.sort_values(["_o", "rank"]).drop(columns="_o").reset_index(drop=True)
    verdicts = []
    for name in order:
        t = table[table["setting"] == name]
        verdicts.append({"setting": name, **rank_trend(t), "bound_holds_every_seed": bool(t["bound_holds"].all()),
                         "n_cells": int(t["n_seeds"].sum())})
    verdict = pd.DataFrame(verdicts)
    tdir = paths.path("table_csv", results=results, study=study.name).parent
    fdir = paths.path("figures", results=results, study=study.name)
    tdir.mkdir(parents=True, exist_ok=True)
    fdir.mkdir(parents=True, exist_ok=True)
    cells.to_csv(tdir / "cells.csv", index=False)
    table.to_csv(paths.path("table_csv", results=results, study=study.name), index=False)
    verdict.to_csv(tdir / "verdict.csv", index=False)
    lines = [f"# {study.name}: empirical KL vs the rank-dependent bound (mean ± sd over seeds)", "",
             "| setting | KL rises with rank | log-log slope of KL on r | KL(r_max)/KL(r_min) "
             "| bound holds in every seed | cells |", "|---|---|---|---|---|---|"]
    for _, v in verdict.iterrows():
        lines.append(f"| {v.setting} | {'yes' if v.rises else 'no'} | {v.slope:.2f} | {v.ratio:.3g} | "
                     f"{'yes' if v.bound_holds_every_seed else 'NO'} | {int(v.n_cells)} |")
    lines += ["", "| setting | rank | KL(π_t‖π_0) | max over inputs | bound μe^μ | bound holds in every seed "
              "| seeds |", "|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r.setting} | {int(r['rank'])} | {r.kl_mean:.3e} ± {r.kl_sd:.1e} | {r.kl_max_mean:.3e} | "
                     f"{r.bound_mean:.3e} ± {r.bound_sd:.1e} | {'yes' if r.bound_holds else 'NO'} | {int(r.n_seeds)} |")
    md = paths.path("table_md", results=results, study=study.name)
    md.write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=130)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(order):
        t = table[table["setting"] == name]
        c = colors[i % len(colors)]
        tag = "" if name == "default" else f" ({name})"
        ax.errorbar(t["rank"], t["kl_mean"], yerr=t["kl_sd"].fillna(0), marker="o", capsize=3, color=c,
                    label=f"empirical KL{tag}")
        ax.errorbar(t["rank"], t["bound_mean"], yerr=t["bound_sd"].fillna(0), marker="s", capsize=3,
                    color=c, ls="--", label=rf"bound $\mu e^\mu${tag}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ranks = sorted(table["rank"].unique())
    ax.set_xticks(ranks, [str(int(r)) for r in ranks])
    ax.set_xlabel("LoRA rank r")
    ax.set_ylabel("KL (nats)")
    ax.set_title(f"{study.name}: KL vs bound, mean ± sd over seeds")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    fig_path = fdir / "kl_vs_bound.png"
    fig.savefig(fig_path)
    plt.close(fig)
    table[["setting", "rank", "kl_mean", "kl_sd", "bound_mean", "bound_sd"]].to_csv(
        fig_path.with_suffix(".csv"), index=False)
    return {"table_md": md, "figure": fig_path, "verdict": tdir / "verdict.csv"}
