"""A synthetic finished study on disk (no training): per-cell summary.json, metrics.csv, evaluation
samples + summaries (final and at snapshots) and diagnostics, shaped like paper 001's reward-density
sweep. Process cells collapse (adv std spike, truncation saturation, accuracy cliff); outcome cells
are stable. Used by the report, stats and browser tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from lorarl.language.study import study_cells, load_study
from tests.support.study import tiny_study

STEPS = 40
N_PROBLEMS = 100
STUDY = {**tiny_study("rep", task=None, adapter=None, train={"steps": STEPS, "kl_monitor_every": 5},
                      eval={"eval_every": 10},
                      axes={
                       "regime": {"field": "reward.regime", "values": ["outcome", "process"]},
                       "rank": {"field": "adapter.rank", "prefix": "r", "values": [
                           1, 16, {"label": "full", "set": {"adapter.method": "full", "adapter.rank": None}}]},
                       "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]},
                   }),
         "baseline": {"rank": "full"}}


def trace(collapsing: bool, seed: int) -> pd.DataFrame:
    """Per-step metrics of a stable or a collapsing cell."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, STEPS + 1)
    if collapsing:
        acc = np.where(steps < 20, 0.3 + 0.02 * steps, np.maximum(0.7 - 0.08 * (steps - 20), 0.0))
        adv = np.where(steps < 15, 1.0, 9.0) + rng.normal(0, 0.05, STEPS)
        trunc = np.clip(0.1 + np.where(steps > 16, 0.3 * (steps - 16), 0.0), 0, 1)
    else:
        acc = np.minimum(0.3 + 0.01 * steps, 0.6)
        adv = 0.8 + rng.normal(0, 0.05, STEPS)
        trunc = np.full(STEPS, 0.05)
    acc = np.clip(acc + rng.normal(0, 0.02, STEPS), 0, 1)
    df = pd.DataFrame({"step": steps, "reward": acc, "accuracy": acc, "adv/std": adv, "frac_truncated": trunc,
                       "grad_norm": 0.5 + adv / 10, "step_time_s": 0.2 + rng.random(STEPS) * 0.01,
                       "time/step_s": 0.19 + rng.random(STEPS) * 0.01})
    mon = steps % 5 == 0
    df["kl_ref/k3"] = np.where(mon, 1e-3 * steps, np.nan)
    df["kl_new_old"] = np.where(mon, 1e-4 * (1 + adv), np.nan)
    df["ppo_kl"] = 5e-5 * (1 + adv)  # verl's, every step
    df["time/kl_monitor_s"] = np.where(mon, 0.05, np.nan)
    return df


def _eval(d: Path, bench_stem: str, correct_P: np.ndarray, step: int | None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"problem_id": f"p{i:03d}", "sample": 0, "prompt": "q", "gold": "1", "completion": "c",
                         "extracted": "1", "correct": bool(c), "timed_out": False, "truncated": False,
                         "n_tokens": 5}) for i, c in enumerate(correct_P)]
    (d / f"{bench_stem}.jsonl").write_text("\n".join(lines) + "\n")
    v = float(correct_P.mean())
    (d / f"{bench_stem}.json").write_text(json.dumps({
        "benchmark": "synthetic", "step": step, "primary_metric": "pass@1", "n_problems": len(correct_P),
        "metrics": {"pass@1": {"value": v, "ci_low": v - 0.1, "ci_high": v + 0.1}}}))


def make_study(tmp: Path, done: set[str] | None = None, study: dict | None = None) -> tuple[Path, Path]:
    """Write the study YAML and the files of its finished cells (all, or those in `done`)."""
    spec = study or STUDY
    sp = tmp / f"{spec['name']}.yaml"
    sp.write_text(yaml.safe_dump(spec, sort_keys=False))
    res = tmp / "results"
    st = load_study(sp)
    for k, cell in enumerate(study_cells(st)):
        if done is not None and cell.id not in done:
            continue
        collapsing = cell.axes["regime"] == "process"
        seed = int(cell.axes["seed"])
        cdir = res / st.name / cell.id
        cdir.mkdir(parents=True, exist_ok=True)
        m = trace(collapsing, 100 * k + seed)
        m.to_csv(cdir / "metrics.csv", index=False)
        from lorarl.train.flags import detect

        full = cell.axes["rank"] == "full"
        (cdir / "summary.json").write_text(json.dumps({
            "study": st.name, "cell": cell.id, "config_hash": cell.hash, "mlflow_run_id": f"run{k:04d}abcdef",
            "steps": STEPS, "final_train_reward": float(m["reward"].tail(4).mean()), "wall_time_s": 10.0 + k,
            "mean_step_time_s": float(m["step_time_s"].mean()),
            "params_trainable": 500_000 if full else 1000 * int(cell.axes["rank"]), "params_total": 500_000,
            "trainable_fraction": 1.0 if full else 0.002 * int(cell.axes["rank"]),
            "flags": detect(m.to_dict("records"))}))
        rng = np.random.default_rng(1000 + k)
        p = 0.55 if not collapsing else 0.05
        _eval(cdir / "eval", "synthetic", rng.random(N_PROBLEMS) < p, None)
        for s in (10, 20, 30):
            q = p if not collapsing else (0.5 if s <= 20 else 0.1)
            _eval(cdir / "eval", f"synthetic@{s}", rng.random(N_PROBLEMS) < q, s)
        rows = [{"matrix": f"model.layers.{i}.q_proj", "metric": met, "index": 0, "value": val}
                for i in range(2) for met, val in (
                    ("bf16_sparsity", 0.1 if full else 0.6), ("max_angle_left_deg", 5.0 + i),
                    ("spectral_drift", 0.01), ("overlap_principal", 0.02), ("overlap_principal_baseline", 0.05),
                    ("overlap_low_magnitude", 0.06), ("overlap_low_magnitude_baseline", 0.05),
                    ("overlap_principal_not_low", 0.02), ("overlap_principal_not_low_baseline", 0.05))]
        if not full:  # paper 003 Fig. 7: a LoRA A's similarity with W0's top/bottom singular vectors, per layer
            rows += [{"matrix": f"model.layers.{i}.q_proj", "metric": f"subspace_sim_{w}{sfx}", "index": step,
                      "value": val - 0.01 * i} for i in range(2) for w, val in (("top", 0.6), ("bottom", 0.2))
                     for sfx, step in [("", 0)] + [("_step", s) for s in (10, 20, 30, STEPS)]]
        views = ("update",) if full else ("update", "product_update")  # the adapter product: LoRA cells
        rows += [{"matrix": "model.layers.0.q_proj", "metric": f"{v}_{q}", "index": i, "value": val}
                 for v in views for i in range(4)
                 for q, val in (("p", 0.25), ("cum_energy", (i + 1) / 4 if v == "update" else min(1.0, (i + 2) / 4)))]
        pd.DataFrame(rows).to_parquet(cdir / "diagnostics.parquet", index=False)
    return sp, res
