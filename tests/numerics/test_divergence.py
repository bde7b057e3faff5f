"""NaN/inf loss, reward or gradient: the cell stops with state `diverged` (lorarl.numerics.divergence).

Fast: the detection, the skipped update, status and the aggregate table of a diverged cell. Slow: a
real training run whose rewards turn NaN at step 3 (fault hook) ends with `diverged` in summary.json,
MLflow and metrics.csv, the non-finite update never applied; a 2-cell study through Snakemake completes
with one cell diverged and the other done.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lorarl.numerics import divergence
from tests.support.study import TRAIN, tiny_study

REPO = Path(__file__).resolve().parents[2]


def test_nonfinite_keys_watch_loss_and_rewards_only():
    row = {"step": 3, "loss": float("nan"), "reward": 1.0, "rewards/outcome/mean": float("inf"),
           "rewards/outcome/std": None, "grad_norm": float("nan"), "entropy": 0.3}
    assert divergence.nonfinite_keys(row) == ["loss", "rewards/outcome/mean", "rewards/outcome/std"]
    assert divergence.nonfinite_keys({"loss": 0.1, "reward": -2.0}) == []


def test_nonfinite_gradient_skips_the_update_and_marks_the_step():
    import torch

    lin = torch.nn.Linear(3, 2)
    before = lin.weight.detach().clone()
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    (lin(torch.ones(1, 3)).sum() * float("nan")).backward()
    d = divergence.Divergence()
    assert d.check_grads(lin, step=5) is True
    opt.step()
    assert torch.equal(lin.weight, before) and torch.isfinite(lin.weight).all()  # update skipped
    assert d.summary() == {"state": "diverged", "diverged_at_step": 5,
                           "diverged_reason": "non-finite gradient (update skipped)"}
    d.check_row({"loss": float("nan")}, step=6)  # the first divergence is the one reported
    assert d.step == 5

    four = divergence.Divergence(updates_per_step=4)  # paper 004: 4 optimiser updates per training step
    four.check_row({"loss": float("inf")}, step=10)  # TRL's global step 10 = the 2nd update of step 3
    assert four.summary() == {"state": "diverged", "diverged_at_step": 3, "diverged_at_update": 10,
                              "diverged_reason": "non-finite loss"}

    ok = divergence.Divergence()
    lin.zero_grad()
    lin(torch.ones(1, 3)).sum().backward()
    assert ok.check_grads(lin, step=1) is False and lin.weight.grad is not None
    assert ok.summary() == {"state": "done"} and divergence.cell_state({}) == "done"


def test_nan_reward_fault_hook_only_fires_at_its_step(monkeypatch):
    from lorarl.rewards import Deposits

    dep = Deposits(positions=[[0], []], values=[[1.0], []])
    monkeypatch.setenv(divergence.FAULT_ENV, "nan_reward_at_step:2")
    divergence.nan_reward_fault(dep, 1)
    assert dep.totals == [1.0, 0.0]
    divergence.nan_reward_fault(dep, 2)
    assert all(math.isnan(t) for t in dep.totals)


def test_aggregate_table_counts_diverged_cells():
    from lorarl.report.aggregate import markdown, seed_table
    from lorarl.language.study import parse_study

    study = parse_study({"name": "dv", "defaults": {"model": "local:tiny-test"},
                         "axes": {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}})
    cells = pd.DataFrame([
        {"cell": "s0", "seed": "s0", "state": "done", "diverged_at_step": None, "final_train_reward": 0.5},
        {"cell": "s1", "seed": "s1", "state": "diverged", "diverged_at_step": 3, "final_train_reward": 0.1},
    ])
    table = seed_table(study, cells)
    assert int(table["n_diverged"].iloc[0]) == 1
    md = markdown(study, table, None, cells)
    assert "2 (1 diverged)" in md and "`s1` diverged at step 3" in md


# ---- slow: real training --------------------------------------------------------------------------

STUDY = tiny_study("dv", train={**TRAIN, "steps": 6, "checkpoint_every": 2}, eval={"max_new_tokens": 8})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_test_base: Path) -> Path:
    from tests.support.trained import place_base

    wd = tmp_path_factory.mktemp("divergence")
    place_base(tiny_test_base, wd / "results")
    (wd / "study.yaml").write_text(yaml.safe_dump(STUDY))
    return wd


@pytest.mark.slow
def test_nan_reward_stops_the_cell_as_diverged(workdir: Path):
    import mlflow
    import torch
    from safetensors.torch import load_file

    env = {**os.environ, divergence.FAULT_ENV: "nan_reward_at_step:3"}
    cmd = [sys.executable, "-m", "lorarl.cli", "run", str(workdir / "study.yaml"), "s0", "--stages", "train",
           "--results", str(workdir / "results"), "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "diverged at step 3" in proc.stderr
    cell = workdir / "results" / "dv" / "s0"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["state"] == "diverged" and summary["diverged_at_step"] == 3
    metrics = pd.read_csv(cell / "metrics.csv")
    assert metrics["step"].tolist() == [1, 2, 3]  # partial metrics kept, the NaN step included
    assert metrics["reward"].iloc[:2].notna().all() and math.isnan(metrics["reward"].iloc[2])
    assert math.isnan(metrics["loss"].iloc[2])
    tensors = load_file(str(cell / "adapter" / "adapter_model.safetensors"))
    assert all(torch.isfinite(t).all() for t in tensors.values())  # the NaN update was never applied
    assert not (workdir / "results" / "dv" / ".checkpoints" / "s0").exists()

    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'results'}/mlflow.db")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.tags["lorarl.state"] == "diverged"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2, 3]

    from lorarl.status import study_status

    st = {r.cell: r for r in study_status(str(workdir / "study.yaml"), workdir / "results")}
    assert st["s0"].train.state == "diverged" and st["s0"].train.step == "3/6"
