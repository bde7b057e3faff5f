"""The shipped adaptive demo (experiments/demo_adaptive.yaml, the file itself) end to end through `snakemake all`,
SIGKILLed in the middle (real training), shrunk the way a user shrinks a study: `--config set=...` (lorarl.study_set:
the tiny test model, 4 steps, a snapshot every 2: one rung at step 2; the axes, `search:` and `hypotheses:` as
shipped).

Two ranks x two KL coefficients x one seed; the search's settings are the ranks (paired over seed and KL), eta 2:
one rank is kept. Each rank has a non-inferiority hypothesis that needs 2 seeds (cap 3): the kept rank's adds seed
1 to its two settings (and seed 2 while undecided: cells outside the search, trained straight through), the stopped
rank's is censored. `snakemake -n` says what waits on the rung; `snakemake all` is SIGKILLed once the rung is
decided and a kept cell trains on; `snakemake all` again finishes the study with the same decisions: the stopped
cells censored at step 2 (checkpoint kept, no summary, MLflow run tagged and finished), the kept ones trained to
the end from their rung (every step once, none retrained, the summary says it resumed there), the added seeds
trained and counted in every table, the status and the search's cell-steps, report.html written; then
`--config search=off` would resume the stopped cells from their rung and rerun none of their rung's evaluations
(a dry run)."""

from __future__ import annotations

import json
import os
import re
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

DEMO = REPO / "experiments" / "demo_adaptive.yaml"
SET = {"model": "local:tiny-test", "task.n_train": 64, "task.n_eval": 8, "train.steps": 4, "train.prompts_per_step": 2,
       "train.generations": 2, "train.max_completion_length": 16, "eval.max_new_tokens": 16, "eval.eval_every": 2}
CELLS = [f"r{r}-kl{k}-s0" for r in ("1", "8") for k in ("0", "0.05")]  # the matrix: the search's cells


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


def planned(proc: subprocess.CompletedProcess) -> set[tuple[str, str]]:
    """(rule, cell) of every job a dry run with `--quiet host` lists."""
    out = set()
    for block in re.split(r"\n(?:local)?rule ", "\n" + proc.stdout + "\n" + proc.stderr)[1:]:
        cell = re.search(r"cell=([^,\s]+)", block)
        out.add((block.split(":", 1)[0].strip(), cell.group(1) if cell else ""))
    return out


def snakemake(wd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(wd, *args), cwd=wd, capture_output=True, text=True, env=env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _text(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def test_adaptive_study_killed_then_finished(tmp_path: Path):
    t0 = time.time()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(DEMO)], "results": "results", "launcher": "local", "slurm": {}, "set": SET}))
    res = tmp_path / "results" / "demo_adaptive"
    dry = snakemake(tmp_path, "-n", "all")
    study = res / "study_set.yaml"  # the shipped file with SET: what every job is handed (lorarl.study_set)
    assert yaml.safe_load(study.read_text())["hypotheses"] == yaml.safe_load(DEMO.read_text())["hypotheses"]
    assert "[lorarl] demo_adaptive: rung 2: waits on 2 setting(s): rank=1, rank=8 (4 cell(s) still to record" in dry.stderr
    assert jobs_run(dry) == {"base_model": 1, "evaluate": 1, "train_rung": 4, "evaluate_step": 4, "decide_rung": 1,
                             "aggregate": 1, "all": 1}  # nothing past the rung before it is decided

    first = subprocess.Popen(command(tmp_path, "all"), cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)  # its jobs: in its process group
    deadline = time.time() + 2400  # a loaded 2-core machine: ~23 min to the kill seen
    views, running = [], []
    while time.time() < deadline and first.poll() is None:  # the rung decided, a kept cell training on
        views = list(res.glob("adaptive/search-*/rung-2-all.json"))
        running = sorted(p.parts[-3] for p in res.glob("*-s0/logs/train.log")  # a searched cell's `train` (to the end)
                         if "submitted job" in _text(p))  # its job in flight
        if views and running:
            break
        time.sleep(1)
    assert views and running and first.poll() is None, (first.poll(), views)
    # Snakemake dies; its launchers and jobs go on as orphans, adopted by the rerun. They are frozen until the
    # rerun has found them: a job that finished in between would have its outputs removed by the rerun's cleanup
    # of incomplete outputs and be trained again from scratch (the window docs/slurm.md names), not adopted.
    os.killpg(first.pid, signal.SIGSTOP)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    before = {c: _text(res / c / "logs" / "train.log") for c in running}  # the frozen launchers write no more
    decided = views[0].read_bytes()
    t_kill = time.time() - t0

    snakemake(tmp_path, "--unlock")
    logs = [open(tmp_path / f"rerun.{k}", "w+") for k in ("out", "err")]  # read once it ended
    second = subprocess.Popen(command(tmp_path, "all"), cwd=tmp_path, env=env(), stdout=logs[0], stderr=logs[1])
    deadline = time.time() + 1200
    try:
        while time.time() < deadline and second.poll() is None and not all(  # the rerun's launcher: found or not
                (t := _text(res / c / "logs" / "train.log")) != before[c] and ("earlier launcher" in t or "submitted job" in t)
                for c in running):
            time.sleep(1)
    finally:
        os.killpg(first.pid, signal.SIGCONT)  # thawed: the adopted jobs finish, their launchers exit
        for f in logs:
            f.close()
    second.wait()
    out, err = (_text(tmp_path / f"rerun.{k}") for k in ("out", "err"))
    assert second.returncode == 0, out[-3000:] + err[-6000:]
    finished(tmp_path, res, decided, running, subprocess.CompletedProcess(second.args, 0, out, err))
    print(f"[adaptive e2e] killed after {t_kill:.0f}s, total {time.time() - t0:.0f}s")


def finished(tmp_path: Path, res: Path, decided: bytes, running: list[str], second: subprocess.CompletedProcess):
    """The study after the rerun: the same decisions, the adopted jobs, the kept, stopped and added cells."""
    import mlflow

    views = list(res.glob("adaptive/search-*/rung-2-all.json"))
    study = res / "study_set.yaml"
    for c in running:  # the rerun waited on the orphan training job instead of submitting a second one
        assert "adopted job" in _text(res / c / "logs" / "train.log"), _text(res / c / "logs" / "train.log")
    assert views[0].read_bytes() == decided  # the same decisions: the view is reused, never redone
    assert "decide_rung" not in jobs_run(second) and "train_rung" not in jobs_run(second)
    view = json.loads(decided)
    assert view["complete"] and sorted(view["decided"].values()) == ["promote", "stop"]
    kept = view["promoted"][0]
    rank, other = kept.removeprefix("rank="), {"rank=1": "8", "rank=8": "1"}[kept]
    ledger = json.loads((res / "adaptive" / "search.json").read_text())
    assert ledger["rungs"][0]["decided"] == view["decided"] and ledger["conflicts"] == []
    assert sorted(ledger["settings"][kept]["cells"]) == [f"r{rank}-kl0-s0", f"r{rank}-kl0.05-s0"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/results/mlflow.db")
    for cell in CELLS:
        d = res / cell
        mark = json.loads((d / "rungs" / "step-2.json").read_text())
        run = client.get_run(mark["mlflow_run_id"])
        assert [m.step for m in client.get_metric_history(run.info.run_id, "adaptive/rung_value")] == [2]
        if cell in ledger["settings"][kept]["cells"]:  # kept: trained from its rung to the end
            summary = json.loads((d / "summary.json").read_text())
            assert summary["mlflow_run_id"] == mark["mlflow_run_id"], (cell, summary["mlflow_run_id"], mark)
            assert summary["resumed_from_steps"] == [2], (cell, summary["resumed_from_steps"])  # from its rung, once
            assert pd.read_csv(d / "metrics.csv")["step"].tolist() == [1, 2, 3, 4]  # none retrained
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2, 3, 4]
            assert (d / "eval" / "synthetic.json").exists() and run.info.status == "FINISHED"
        else:  # stopped: censored at its rung, checkpoint kept, never trained further
            assert not (d / "summary.json").exists() and not (d / "eval" / "synthetic.json").exists()
            assert (res / ".checkpoints" / cell / "checkpoint-2" / "lorarl.json").exists()
            assert run.data.tags["lorarl.state"] == "stopped" and run.data.tags["lorarl.stopped_at_step"] == "2"
            assert run.info.status == "FINISHED"
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2]
    # the kept rank's hypothesis added seed 1 (and 2 if undecided at 2 seeds) to its two settings, trained straight
    # through outside the search; the stopped rank's is censored and adds none
    hyp = json.loads((res / "adaptive" / "hypotheses.json").read_text())["hypotheses"]
    used = hyp[f"kl_free_not_worse_r{rank}"]["seeds_used"]
    assert used in (2, 3) and hyp[f"kl_free_not_worse_r{rank}"]["decision"] in (
        ("supported", "refuted", "inconclusive") if used == 3 else ("supported", "refuted"))
    assert hyp[f"kl_free_not_worse_r{other}"]["decision"] == "censored"
    added = [f"r{rank}-kl{k}-s{s}" for s in range(1, used) for k in ("0", "0.05")]
    for cell in added:
        assert json.loads((res / cell / "summary.json").read_text())["steps"] == 4
        assert (res / cell / "eval" / "synthetic.json").exists() and not (res / cell / "rungs").exists()
    assert sorted(p.name for p in res.glob("r*-s[1-9]*")) == sorted(added)  # none beyond the looks, none for the other
    cells = pd.read_csv(res / "tables" / "cells.csv")
    assert sorted(cells.loc[cells["state"] == "stopped", "cell"]) == [f"r{other}-kl0-s0", f"r{other}-kl0.05-s0"]
    assert set(added) <= set(cells["cell"])  # the added seeds in every table
    summary = pd.read_csv(res / "tables" / "summary.csv", dtype={"rank": str})
    assert summary.loc[summary["rank"] == rank, "n_seeds"].tolist() == [used, used]
    search = pd.read_csv(res / "tables" / "search.csv", dtype={"rank": str}).set_index("rank")
    assert search.loc[rank, "state"] == "finished" and search.loc[rank, "n_cells"] == 2 + len(added)
    assert search.loc["all", "cell_steps"] == 4 * (2 + len(added)) + 2 * 2  # kept + added cells to 4; stopped to 2
    assert "censored at step 2" in (res / "tables" / "stats.md").read_text()
    page = (res / "report.html").read_text()
    assert "search_rungs" in page and all(c in page for c in added)
    status = subprocess.run([sys.executable, "-m", "lorarl.cli", "status", str(study),
                             "--results", str(tmp_path / "results")], capture_output=True, text=True, env=env())
    assert f"{2 + len(added)} done, 2 stopped" in status.stdout, status.stdout + status.stderr
    assert all(c in status.stdout for c in added), status.stdout

    again = snakemake(tmp_path, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr
    assert "[lorarl] demo_adaptive: rung 2: promoted " in again.stderr and "stopped (censored)" in again.stderr
    off = planned(snakemake(tmp_path, "-n", "all", "--config", "search=off", "--quiet", "host"))
    # search off: the stopped cells train on from their rung, their rung's evaluations stay (the hypotheses stay on:
    # the stopped rank's is no longer censored, so it may ask for its own added seeds)
    stopped = {f"r{other}-kl0-s0", f"r{other}-kl0.05-s0"}
    assert {c for r, c in off if r == "train"} >= stopped and not {r for r, _ in off} & {"train_rung", "decide_rung"}, off
    assert not {c for r, c in off if r == "evaluate_step"} & stopped, off
