"""The shipped adaptive demo (experiments/demo_adaptive.yaml) end to end through `snakemake all`, SIGKILLed in the
middle (real training, tiny model), as a user runs it: shrunk with `--config set` to the tiny test model, 4 steps
and a snapshot every 2 (one rung at step 2, eta 2: one rank kept). `snakemake -n` says what waits on the rung;
`snakemake all` is SIGKILLed once the rung is decided and the kept cells train on; `snakemake all` again finishes
the study with the same decisions: the stopped rank's cells censored at step 2 (checkpoint kept, no summary, MLflow
run tagged and finished), the kept ones trained to the end from their rung (every step once, none retrained); the
kept rank's hypothesis adds seeds (ordinary cells trained to their end) until it is decided or reaches its cap,
the stopped rank's is censored; the added-seed cells are in every table, the search's cell-step count, `lorarl
status`, the console's progress line and the report. Then `--config search=off` would resume the stopped cells
from their rung, rerun none of their rung's evaluations, and add the second seed their hypothesis needs (a dry
run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support.snakemake import jobs_run, run_snakemake, snakemake_cmd, snakemake_env


REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
DEMO = REPO / "experiments" / "demo_adaptive.yaml"
SMALL = {"model": "local:tiny-test", "task.n_train": 64, "task.n_eval": 8, "train.steps": 4,
         "train.prompts_per_step": 2, "train.generations": 2, "train.max_completion_length": 16,
         "eval.max_new_tokens": 16, "eval.eval_every": 2}
GRID = ("r1-kl0-s0", "r1-kl0.05-s0", "r8-kl0-s0", "r8-kl0.05-s0")


def test_shipped_adaptive_demo_killed_then_finished(tmp_path: Path):
    import mlflow

    t0 = time.time()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(DEMO)], "results": "results", "launcher": "local", "slurm": {}, "set": SMALL,
         "progress_every": 5}))
    res = tmp_path / "results" / "demo_adaptive"
    dry = run_snakemake(tmp_path, "-n", "all")
    assert "[lorarl] demo_adaptive: rung 2: waits on 2 setting(s): rank=1, rank=8 (4 cell(s) still to record" in dry.stderr
    assert jobs_run(dry) == {"base_model": 1, "evaluate": 1, "train_rung": 4, "evaluate_step": 4, "decide_rung": 1,
                             "aggregate": 1, "all": 1}  # nothing past the rung before it is decided

    first = subprocess.Popen(snakemake_cmd(tmp_path, "all"), cwd=tmp_path, env=snakemake_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 1500
    views = []
    while time.time() < deadline and first.poll() is None:  # the rung decided, the kept cells training on
        views = list(res.glob("adaptive/search-*/rung-2-all.json"))
        if views and any((res / c / "logs" / "train.log").exists() for c in GRID):  # a kept cell's `train` job
            break
        time.sleep(1)
    assert views and first.poll() is None, (first.poll(), views)
    os.kill(first.pid, signal.SIGKILL)  # Snakemake dies; its jobs go on as orphans
    first.wait()
    decided = views[0].read_bytes()
    t_kill = time.time() - t0
    # the orphaned train jobs finish before the rerun, which keeps their outputs (lorarl.train.salvage: a cell
    # Snakemake would rerun for the killed run's marks, or whose outputs it would delete as unexpected, is put back)
    orphans = sorted(p.parents[1].name for p in res.glob("*/logs/train.log"))
    deadline = time.time() + 600
    while time.time() < deadline and not all((res / c / "summary.json").exists() for c in orphans):
        time.sleep(1)
    assert any(c in GRID for c in orphans) and all((res / c / "summary.json").exists() for c in orphans), orphans
    before = {c: (res / c / "summary.json").read_text() for c in orphans}

    run_snakemake(tmp_path, "--unlock")
    second = run_snakemake(tmp_path, "all")
    console = second.stdout + second.stderr
    assert views[0].read_bytes() == decided  # the same decisions: the view is reused, never redone
    assert "decide_rung" not in jobs_run(second) and "train_rung" not in jobs_run(second)
    assert "progress unavailable" not in console, console[-3000:]
    for c in orphans:  # finished by the killed run's job: kept, not retrained
        assert (res / c / "summary.json").read_text() == before[c], c
    assert f"[lorarl] demo_adaptive report : results/demo_adaptive/report.html" in console, console[-3000:]
    view = json.loads(decided)
    assert view["complete"] and sorted(view["decided"].values()) == ["promote", "stop"]
    kept = view["promoted"][0]
    ledger = json.loads((res / "adaptive" / "search.json").read_text())
    assert ledger["rungs"][0]["decided"] == view["decided"] and ledger["conflicts"] == []
    kept_cells = ledger["settings"][kept]["cells"]
    kept_rank, stopped_rank = ("8", "1") if "r8-kl0-s0" in kept_cells else ("1", "8")
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/results/mlflow.db")
    for cell in GRID:
        d = res / cell
        mark = json.loads((d / "rungs" / "step-2.json").read_text())
        run = client.get_run(mark["mlflow_run_id"])
        assert [m.step for m in client.get_metric_history(run.info.run_id, "adaptive/rung_value")] == [2]
        if cell in kept_cells:  # kept: trained from its rung to the end
            summary = json.loads((d / "summary.json").read_text())
            assert summary["resumed_from_steps"] == [2] and summary["mlflow_run_id"] == mark["mlflow_run_id"]
            assert pd.read_csv(d / "metrics.csv")["step"].tolist() == [1, 2, 3, 4]  # none retrained
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2, 3, 4]
            assert (d / "eval" / "synthetic.json").exists() and run.info.status == "FINISHED"
        else:  # stopped: censored at its rung, checkpoint kept, never trained further
            assert not (d / "summary.json").exists() and not (d / "eval" / "synthetic.json").exists()
            assert (res / ".checkpoints" / cell / "checkpoint-2" / "lorarl.json").exists()
            assert run.data.tags["lorarl.state"] == "stopped" and run.data.tags["lorarl.stopped_at_step"] == "2"
            assert run.info.status == "FINISHED"
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2]

    # the hypotheses: the stopped rank's censored; the kept rank's added seeds (ordinary cells, trained to the end)
    hyps = json.loads((res / "adaptive" / "hypotheses.json").read_text())["hypotheses"]
    assert hyps[f"kl_free_not_worse_r{stopped_rank}"]["decision"] == "censored"
    h = hyps[f"kl_free_not_worse_r{kept_rank}"]
    assert h["seeds_used"] >= 2 and (h["decision"] != "undecided" or h["seeds_used"] == 3), h
    added = [f"r{kept_rank}-kl{kl}-s{s}" for s in range(1, h["seeds_used"]) for kl in ("0", "0.05")]
    for cell in added:
        summary = json.loads((res / cell / "summary.json").read_text())
        assert summary["state"] == "done" and pd.read_csv(res / cell / "metrics.csv")["step"].tolist() == [1, 2, 3, 4]
        assert (res / cell / "eval" / "synthetic.json").exists()
    assert not list(res.glob(f"r{stopped_rank}-*-s1"))  # a censored hypothesis adds no seed

    tables = res / "tables"
    cells = pd.read_csv(tables / "cells.csv")
    assert set(cells["cell"]) == {*GRID, *added}
    assert sorted(cells.loc[cells["state"] == "stopped", "cell"]) == sorted(c for c in GRID if c not in kept_cells)
    summary_csv = pd.read_csv(tables / "summary.csv", dtype={"rank": str, "kl": str})
    kept_rows = summary_csv[summary_csv["rank"] == kept_rank]
    assert kept_rows["n_seeds"].tolist() == [h["seeds_used"]] * 2, summary_csv  # the added seeds counted
    search = pd.read_csv(tables / "search.csv", dtype={"rank": str})
    row = search[search["rank"] == kept_rank].iloc[0]
    assert row["state"] == "finished" and row["n_cells"] == 2 * h["seeds_used"]
    assert row["cell_steps"] == 4 * 2 * h["seeds_used"]  # every added seed's 4 steps spent
    assert search[search["rank"] == "all"].iloc[0]["cell_steps"] == row["cell_steps"] + 2 * 2  # + the stopped rank's
    assert "censored at step 2" in (tables / "stats.md").read_text()
    html = (res / "report.html").read_text()
    assert "search_rungs" in html and all(c in html for c in added)
    status = subprocess.run([sys.executable, "-m", "lorarl.cli", "status", str(res / "study_set.yaml"),
                             "--results", str(tmp_path / "results")], capture_output=True, text=True, env=snakemake_env())
    assert f"{2 + len(added)} done, 2 stopped" in status.stdout, status.stdout + status.stderr
    assert all(c in status.stdout for c in added), status.stdout

    again = run_snakemake(tmp_path, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr
    assert "[lorarl] demo_adaptive: rung 2: promoted " in again.stderr and "stopped (censored)" in again.stderr
    off = run_snakemake(tmp_path, "-n", "all", "--config", "search=off")
    # search off: the stopped cells train on from their rung and their hypothesis waits on them (not censored):
    # its look at 2 seeds asks for seed 1 of both settings; their rung's evaluations stay
    assert (f"hypothesis kl_free_not_worse_r{stopped_rank} (non_inferiority): undecided after 0 seed(s)"
            in off.stderr), off.stderr
    jobs = jobs_run(off)
    assert jobs.get("train") == 4 and jobs.get("hypothesis_look") == 1, jobs
    assert "evaluate_step" not in jobs and "train_rung" not in jobs, jobs
    print(f"[adaptive e2e] killed after {t_kill:.0f}s, total {time.time() - t0:.0f}s")
