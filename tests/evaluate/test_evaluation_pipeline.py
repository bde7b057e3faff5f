"""End to end through Snakemake: two benchmarks (synthetic greedy + GSM8K from a local file in its
real schema, sampled avg@2 / pass@1 / pass@2), adapter snapshots every 2 steps and their
evaluation (the curve), `lorarl rescore`, and an evaluation-only change that reruns evaluations
only.  Real training of the tiny model, 2 seeds x 4 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support.snakemake import jobs_run, run_snakemake  # Snakemake's job-stats table, parsed
from tests.support.study import TRAIN, tiny_study

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

GSM8K = [{"question": "Tom has 3 apples and buys 39 more. How many?", "answer": "3+39=<<3+39=42>>42\n#### 42"},
         {"question": "What is 2+2?", "answer": "#### 4"},
         {"question": "What is 10-3?", "answer": "#### 7"}]


def study(gsm8k_path: str, max_new_tokens: int = 8) -> dict:
    return tiny_study("e2eval", task={"name": "synthetic", "n_train": 64, "n_eval": 6}, train={**TRAIN, "steps": 4},
                      eval={"max_new_tokens": 12, "eval_every": 2, "curve_benchmarks": ["synthetic"],
                            "benchmarks": {
                                "synthetic": {},
                                "gsm8k": {"path": gsm8k_path, "limit": 2,
                                          "protocol": {"temperature": 0.6, "n": 2, "ks": [1, 2],
                                                       "max_new_tokens": max_new_tokens}}}})


def run(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True, env=env)
    assert not check or proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_test_base) -> Path:
    from tests.support.trained import place_base

    wd = tmp_path_factory.mktemp("evalpipe")
    place_base(tiny_test_base, wd / "results")  # the session's base model: no base_model job here
    (wd / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    (wd / "study.yaml").write_text(yaml.safe_dump(study(str(wd / "gsm8k.jsonl")), sort_keys=False))
    (wd / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(wd / "study.yaml")], "results": "results", "launcher": "local", "slurm": {}}))
    return wd


def test_benchmarks_snapshots_curve_rescore_and_eval_only_rerun(workdir: Path):
    import mlflow

    first = run_snakemake(workdir, "all")
    stats = jobs_run(first)
    assert stats.get("train") == 2 and stats.get("evaluate") == 6 and stats.get("evaluate_step") == 2, stats
    res = workdir / "results" / "e2eval"
    for cell in ("s0", "s1"):
        d = res / cell
        assert (d / "snapshots" / "step-2" / "adapter_config.json").exists()
        assert not (d / "snapshots" / "step-4").exists()                 # the last step is the final adapter
        snap = d / "snapshots" / "step-2" / "adapter_model.safetensors"   # saved mid-run (the tiny model's
        assert snap.stat().st_mtime_ns < (d / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns
        assert (d / "snapshots" / "step-2" / "lorarl_adapter.json").exists()   # rewards may all be 0: no bytes check)
        for stem in ("synthetic", "gsm8k", "synthetic@2"):
            assert (d / "eval" / f"{stem}.jsonl").exists() and (d / "eval" / f"{stem}.json").exists()
        g = json.loads((d / "eval" / "gsm8k.json").read_text())
        assert set(g["metrics"]) == {"avg@2", "pass@1", "pass@2"} and g["n_problems"] == 2 and g["n_samples"] == 4
        assert len((d / "eval" / "gsm8k.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in (res / "base" / "eval").glob("*.json")) == ["gsm8k.json", "synthetic.json"]

    client = mlflow.MlflowClient(f"sqlite:///{workdir}/results/mlflow.db")
    exp = client.get_experiment_by_name("e2eval")
    runs = client.search_runs([exp.experiment_id], "tags.`lorarl.cell_id` != ''")  # the cells, not the study run
    bases = [r for r in runs if r.data.tags.get("lorarl.base") == "true"]
    assert len(bases) == 1 and {"eval/synthetic/pass_at_1", "eval/gsm8k/avg_at_2"} <= set(bases[0].data.metrics)
    for r in runs:
        if r in bases:
            continue
        hist = client.get_metric_history(r.info.run_id, "eval/synthetic/pass_at_1")
        assert sorted(m.step for m in hist) == [2, 4]                    # one job per target: no duplicates
        assert [m.step for m in client.get_metric_history(r.info.run_id, "eval/gsm8k/pass_at_2")] == [4]

    table = pd.read_csv(res / "tables" / "summary.csv")
    for col in ("synthetic/pass@1", "gsm8k/avg@2", "gsm8k/pass@1", "gsm8k/pass@2"):
        assert f"{col}_mean" in table and f"{col}_sd" in table
    md = (res / "tables" / "summary.md").read_text()
    assert "gsm8k avg@2" in md and "| base (local:tiny-test) |" in md
    curve = pd.read_csv(res / "tables" / "eval_curves.csv")
    assert sorted(set(curve["step"])) == [2, 4] and len(curve) == 4
    assert (res / "figures" / "eval_curve_synthetic.png").stat().st_size > 1000

    # rescore reproduces every stored summary exactly, and leaves the files alone
    mtimes = {p: p.stat().st_mtime_ns for p in res.glob("*/eval/*.json*")}
    proc = run(workdir, "lorarl", "rescore", str(workdir / "study.yaml"), "--results", "results", "--check")
    assert "8 evaluation(s) re-scored; 0 changed" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in res.glob("*/eval/*.json*")} == mtimes
    again = run_snakemake(workdir, "all")
    assert "Nothing to be done" in again.stderr + again.stdout, again.stderr[-3000:]

    # an evaluation-only change: only the GSM8K evaluations (2 cells + base) and the aggregate rerun
    (workdir / "study.yaml").write_text(yaml.safe_dump(study(str(workdir / "gsm8k.jsonl"), 6), sort_keys=False))
    changed = run_snakemake(workdir, "all")
    assert jobs_run(changed) == {"evaluate": 3, "aggregate": 1, "all": 1}, changed.stderr[-3000:]
    assert json.loads((res / "s0" / "eval" / "gsm8k.json").read_text())["protocol"]["max_new_tokens"] == 6
