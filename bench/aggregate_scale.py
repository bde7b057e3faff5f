"""Cost of the aggregate stage (`lorarl aggregate`: tables + figures, then the report: stats tables,
the papers' figures, report.html) on a synthetic finished study of 1,000 cells x 500 steps.

Writes, per cell, what training/evaluation/diagnosis write (summary.json, a 500-row metrics.csv with
the recorder's columns, the final evaluation's samples + summary, diagnostics.parquet) into a
temporary folder, then times `lorarl.report.aggregate.aggregate` and `lorarl.report.build` in this process,
each once (the second call of each is timed too: the study's cell table is then already built).

    python bench/aggregate_scale.py                 # 1000 cells x 500 steps
    python bench/aggregate_scale.py --cells 100 --steps 100

Target (issue 10): the aggregate stage of 1,000 cells x 500 steps <= 20 s.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

SHAPES = {100: (5, 5, 4), 1000: (10, 10, 10)}  # rank x kl x seed
N_PROBLEMS = 100


def study(n: int, steps: int) -> dict:
    r, k, s = SHAPES[n]
    return {"name": "aggscale", "defaults": {"model": "local:tiny-test", "train": {"steps": steps, "kl_monitor_every": 10}},
            "axes": {"rank": {"field": "adapter.rank", "prefix": "r", "values": [2 ** i for i in range(r)]},
                     "kl": {"field": "train.beta", "prefix": "kl", "values": [round(0.01 * i, 2) for i in range(k)]},
                     "seed": {"field": "seed", "prefix": "s", "values": list(range(s))}}}


def metrics(rng: np.random.Generator, steps: int) -> pd.DataFrame:
    t = np.arange(1, steps + 1)
    acc = np.clip(0.3 + 0.3 * (1 - np.exp(-t / 100)) + rng.normal(0, 0.03, steps), 0, 1)
    mon = t % 10 == 0
    return pd.DataFrame({
        "step": t, "reward": acc, "reward_std": 0.3 + rng.normal(0, 0.01, steps), "accuracy": acc,
        "loss": rng.normal(0, 0.01, steps), "grad_norm": 0.5 + rng.random(steps), "adv/std": 0.8 + rng.normal(0, 0.05, steps),
        "frac_truncated": np.full(steps, 0.05), "completion_length": 30 + rng.normal(0, 2, steps),
        "lr": np.full(steps, 5e-4), "kl": np.abs(rng.normal(0, 1e-3, steps)),
        "kl_ref/k3": np.where(mon, 1e-3 * t, np.nan), "kl_new_old": np.where(mon, 1e-4, np.nan),
        "time/kl_monitor_s": np.where(mon, 0.05, np.nan), "step_time_s": 0.2 + rng.random(steps) * 0.01,
        "time/step_s": 0.19 + rng.random(steps) * 0.01,
    })


def write_eval(d: Path, correct_P: np.ndarray) -> None:
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"problem_id": f"p{i:03d}", "sample": 0, "prompt": "q", "gold": "1", "completion": "c",
                         "extracted": "1", "correct": bool(c), "timed_out": False, "truncated": False, "n_tokens": 5})
             for i, c in enumerate(correct_P)]
    (d / "synthetic.jsonl").write_text("\n".join(lines) + "\n")
    v = float(correct_P.mean())
    (d / "synthetic.json").write_text(json.dumps({
        "benchmark": "synthetic", "step": None, "primary_metric": "pass@1", "n_problems": len(correct_P),
        "metrics": {"pass@1": {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}}}))


def diagnostics_template() -> pd.DataFrame:
    """The real diagnostics (lorarl.diagnose.weights) of two small adapted matrices: every metric the
    diagnose stage writes, in its long format."""
    import torch

    from lorarl.diagnose.weights import diagnose_model

    g = torch.Generator().manual_seed(0)
    pairs = {}
    for i in range(2):
        W0 = torch.randn(32, 16, generator=g)
        B, A = torch.randn(32, 2, generator=g) * 0.01, torch.randn(2, 16, generator=g)
        pairs[f"model.layers.{i}.self_attn.q_proj"] = (W0, W0 + B @ A, A)
    return diagnose_model(pairs, k=4)


def make(tmp: Path, n: int, steps: int) -> tuple[Path, Path]:
    from lorarl.language.study import cell_table, load_study

    sp = tmp / "aggscale.yaml"
    sp.write_text(yaml.safe_dump(study(n, steps), sort_keys=False))
    res = tmp / "results"
    table = cell_table(load_study(sp))
    diag = diagnostics_template()
    for k, cell in enumerate(table.cells):
        rng = np.random.default_rng(k)
        cdir = res / "aggscale" / cell.id
        cdir.mkdir(parents=True, exist_ok=True)
        m = metrics(rng, steps)
        m.to_csv(cdir / "metrics.csv", index=False)
        (cdir / "summary.json").write_text(json.dumps({
            "study": "aggscale", "cell": cell.id, "config_hash": cell.hash, "mlflow_run_id": f"run{k}", "state": "done",
            "steps": steps, "final_train_reward": float(m["reward"].tail(steps // 10).mean()), "wall_time_s": 100.0,
            "mean_step_time_s": float(m["step_time_s"].mean()), "params_trainable": 1000 * cell.config.adapter.rank,
            "params_total": 600_000, "trainable_fraction": cell.config.adapter.rank / 600, "flags": {}}))
        write_eval(cdir / "eval", rng.random(N_PROBLEMS) < 0.5)
        diag.assign(value=diag["value"] * (1 + rng.normal(0, 0.01, len(diag)))).to_parquet(
            cdir / "diagnostics.parquet", index=False)
    for b in table.bases:
        write_eval(res / "aggscale" / b.id / "eval", np.random.default_rng(99).random(N_PROBLEMS) < 0.3)
    return sp, res


def timed(fn, *args) -> tuple[float, float]:
    """(wall s, CPU s of this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", type=int, default=1000, choices=sorted(SHAPES), help="number of cells")
    p.add_argument("--steps", type=int, default=500, help="training steps of metrics per cell")
    a = p.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    with tempfile.TemporaryDirectory(prefix="lorarl-agg-") as tmp:
        t0 = time.perf_counter()
        sp, res = make(Path(tmp), a.cells, a.steps)
        print(f"synthetic study: {a.cells} cells x {a.steps} steps written in {time.perf_counter() - t0:.1f} s "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        from lorarl.language import study as study_mod
        from lorarl.report.aggregate import aggregate
        from lorarl.report import build

        study_mod._LOADED.clear()  # time the cell table's build too
        t_load = timed(study_mod.load_study, sp)
        study = study_mod.load_study(sp)
        t_agg = timed(aggregate, study, res)
        t_rep = timed(build, str(sp), res)
        total = [sum(x) for x in zip(t_load, t_agg, t_rep)]
        figs = len(list((res / "aggscale" / "figures").glob("*.png")))
        print("| part | wall s | CPU s |\n|---|---:|---:|")
        for name, (w, c) in (("load study + cell table", t_load), ("aggregate: tables + figures", t_agg),
                             ("report: stats tables, paper figures, report.html", t_rep)):
            print(f"| {name} | {w:.2f} | {c:.2f} |")
        print(f"| **aggregate stage total** | **{total[0]:.2f}** | **{total[1]:.2f}** |")
        print(f"{figs} figures written; target <= 20 s: {'met' if total[0] <= 20 else 'NOT met'} on wall time, "
              f"{'met' if total[1] <= 20 else 'NOT met'} on CPU time (load average at end {os.getloadavg()[0]:.1f})")

if __name__ == "__main__":
    main()
