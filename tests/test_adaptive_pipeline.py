"""An adaptive study end to end through `snakemake all`, SIGKILLed in the middle (real training, tiny model).

Two settings of one seed each (the pairing of seeds is tested on hand-built records), 4 steps, one rung at
step 2 (eta 2: one setting kept). `snakemake -n` says what waits
on the rung; `snakemake all` is SIGKILLed once the rung is decided and the kept cells train on; `snakemake all`
again finishes the study with the same decisions: the stopped cells censored at step 2 (checkpoint kept, no
summary, MLflow run tagged and finished), the kept ones trained to the end from their rung (every step once,
none retrained), censored rows in the tables; then `--config search=off` would resume the stopped cells from
their rung and rerun none of their rung's evaluations (a dry run)."""

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


REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

STUDY = {
    "name": "ad",
    "defaults": {
        "model": "local:tiny-test",
        "task": {"name": "synthetic", "n_train": 64, "n_eval": 8},
        "adapter": {"rank": 2, "alpha": 4},
        "train": {"steps": 4, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16, "lr": 1e-3},
        "eval": {"max_new_tokens": 16, "eval_every": 2},
    },
    "axes": {"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 2]},
             "seed": {"field": "seed", "prefix": "s", "values": [0]}},
    "search": {"rule": "sha", "rungs": [2], "eta": 2},
}


def command(wd: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(wd),
            "--configfile", str(wd / "config.yaml"), "--cores", "2", *args]


def env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def jobs_run(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's job-stats table (a dry run prints it to stdout, a run to stderr)."""
    out, on = {}, False
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        parts = line.split()
        if line.startswith("job ") and "count" in line:
            on, out = True, {}
        elif on and len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            out[parts[0]] = int(parts[1])
        elif on and parts and parts[0] == "total":
            on = False
    return out


def snakemake(wd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(wd, *args), cwd=wd, capture_output=True, text=True, env=env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_adaptive_study_killed_then_finished(tmp_path: Path):
    import mlflow

    t0 = time.time()
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(tmp_path / "study.yaml")], "results": "results", "launcher": "local", "slurm": {}}))
    res = tmp_path / "results" / "ad"
    dry = snakemake(tmp_path, "-n", "all")
    assert "[lorarl] ad: rung 2: waits on 2 setting(s): rank=1, rank=2 (2 cell(s) still to record" in dry.stderr
    assert jobs_run(dry) == {"base_model": 1, "evaluate": 1, "train_rung": 2, "evaluate_step": 2, "decide_rung": 1,
                             "aggregate": 1, "all": 1}  # nothing past the rung before it is decided

    first = subprocess.Popen(command(tmp_path, "all"), cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 1500
    views = []
    while time.time() < deadline and first.poll() is None:  # the rung decided, the kept cells training on
        views = list(res.glob("adaptive/search-*/rung-2-all.json"))
        if views and list(res.glob("*/logs/train.log")):  # the log of a `train` job (to the end)
            break
        time.sleep(1)
    assert views and first.poll() is None, (first.poll(), views)
    os.kill(first.pid, signal.SIGKILL)  # Snakemake dies; its jobs go on as orphans, adopted by the rerun
    first.wait()
    decided = views[0].read_bytes()
    t_kill = time.time() - t0

    snakemake(tmp_path, "--unlock")
    second = snakemake(tmp_path, "all")
    assert views[0].read_bytes() == decided  # the same decisions: the view is reused, never redone
    assert "decide_rung" not in jobs_run(second) and "train_rung" not in jobs_run(second)
    view = json.loads(decided)
    assert view["complete"] and sorted(view["decided"].values()) == ["promote", "stop"]
    kept = view["promoted"][0]
    ledger = json.loads((res / "adaptive" / "search.json").read_text())
    assert ledger["rungs"][0]["decided"] == view["decided"] and ledger["conflicts"] == []
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/results/mlflow.db")
    for cell in ("r1-s0", "r2-s0"):
        d = res / cell
        mark = json.loads((d / "rungs" / "step-2.json").read_text())
        run = client.get_run(mark["mlflow_run_id"])
        assert [m.step for m in client.get_metric_history(run.info.run_id, "adaptive/rung_value")] == [2]
        if ledger["settings"][kept]["cells"].count(cell):  # kept: trained from its rung to the end
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
    cells = pd.read_csv(res / "tables" / "cells.csv")
    assert sorted(cells.loc[cells["state"] == "stopped", "cell"]) == sorted(
        c for c in ("r1-s0", "r2-s0") if c not in ledger["settings"][kept]["cells"])
    assert "censored at step 2" in (res / "tables" / "stats.md").read_text()
    assert "search_rungs" in (res / "report.html").read_text()
    status = subprocess.run([sys.executable, "-m", "lorarl.cli", "status", str(tmp_path / "study.yaml"),
                             "--results", str(tmp_path / "results")], capture_output=True, text=True, env=env())
    assert "1 done, 1 stopped" in status.stdout, status.stdout + status.stderr

    again = snakemake(tmp_path, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr
    assert "[lorarl] ad: rung 2: promoted " in again.stderr and "stopped (censored)" in again.stderr
    off = jobs_run(snakemake(tmp_path, "-n", "all", "--config", "search=off"))
    # search off: the stopped cell trains on from its rung (1 train job), its rung's evaluation stays
    assert off.get("train") == 1 and "evaluate_step" not in off and "train_rung" not in off, off
    print(f"[adaptive e2e] killed after {t_kill:.0f}s, total {time.time() - t0:.0f}s")
