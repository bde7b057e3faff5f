"""The toy KL-bound study through the normal pipeline: cells, per-cell files, MLflow, aggregate.

Each (rank, seed) cell costs ~0.1 s, so one job runs every cell of the study in a single process
(one Python + torch start-up for all), sharing the pretrained base, and still writes one folder
and one MLflow run per cell. Rerunning one cell reruns this batch (about twenty seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from lorarl import paths
from lorarl.study import Study, study_cells
from lorarl.toy.kl_bound import KLBoundConfig, load_base, pretrain, run_one, save_base


class ToyCellConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    toy: KLBoundConfig = KLBoundConfig()  # the paper's §5.1 hyper-parameters (ranks/seeds come from axes)
    rank: int = Field(1, gt=0, le=64)  # LoRA rank r of the adapted 256x64 projection
    seed: int = 0  # LoRA init + batch order


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def run_toy_study(study: Study, results: str | Path = "results", cells: list[str] | None = None) -> list[dict]:
    """Run the given cells (default: all) in this process; one folder + one MLflow run each."""
    from tqdm import tqdm

    from lorarl.tracking import Tracker

    todo = [c for c in study_cells(study) if cells is None or c.id in cells]
    tracker = Tracker(results, study.name)
    bases: dict[str, dict] = {}
    out = []
    for cell in tqdm(todo, desc=f"{study.name} cells", mininterval=2):
        cfg: ToyCellConfig = cell.config
        key = json.dumps(cfg.toy.model_dump(mode="json", exclude={"ranks", "seeds"}), sort_keys=True)
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


def aggregate_toy(study: Study, results: str | Path = "results") -> dict[str, Path]:
    """Per-rank table (mean ± sd over seeds) and the KL-and-bound-vs-rank figure (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for cell in study_cells(study):
        s = json.loads(paths.path("summary", results=results, study=study.name, cell=cell.id).read_text())
        rows.append({"cell": cell.id, **cell.axes, **s})
    cells = pd.DataFrame(rows)
    g = cells.groupby("rank")[["kl", "kl_max", "bound", "mu"]]
    table = g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_sd")).join(g.size().rename("n_seeds"))
    table = table.join(cells.groupby("rank")["bound_holds"].all()).reset_index().sort_values("rank")
    tdir = paths.path("table_csv", results=results, study=study.name).parent
    fdir = paths.path("figures", results=results, study=study.name)
    tdir.mkdir(parents=True, exist_ok=True)
    fdir.mkdir(parents=True, exist_ok=True)
    cells.to_csv(tdir / "cells.csv", index=False)
    table.to_csv(paths.path("table_csv", results=results, study=study.name), index=False)
    lines = [f"# {study.name}: empirical KL vs the rank-dependent bound (mean ± sd over seeds)", "",
             "| rank | KL(π_t‖π_0) | max over inputs | bound μe^μ | bound holds in every seed | seeds |",
             "|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {int(r['rank'])} | {r.kl_mean:.3e} ± {r.kl_sd:.1e} | {r.kl_max_mean:.3e} | "
                     f"{r.bound_mean:.3e} ± {r.bound_sd:.1e} | {'yes' if r.bound_holds else 'NO'} | {int(r.n_seeds)} |")
    md = paths.path("table_md", results=results, study=study.name)
    md.write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=130)
    for col, label, color in (("kl", "empirical KL", "tab:blue"), ("bound", r"bound $\mu(r)\,e^{\mu(r)}$", "tab:red")):
        ax.errorbar(table["rank"], table[f"{col}_mean"], yerr=table[f"{col}_sd"].fillna(0), marker="o",
                    capsize=3, color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(table["rank"], [str(int(r)) for r in table["rank"]])
    ax.set_xlabel("LoRA rank r")
    ax.set_ylabel("KL (nats)")
    ax.set_title(f"{study.name}: KL vs bound, mean ± sd over seeds")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig_path = fdir / "kl_vs_bound.png"
    fig.savefig(fig_path)
    plt.close(fig)
    table[["rank", "kl_mean", "kl_sd", "bound_mean", "bound_sd"]].to_csv(fig_path.with_suffix(".csv"), index=False)
    return {"table_md": md, "figure": fig_path}
