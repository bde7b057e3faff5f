"""A study run with `snakemake all` (the documented command, in a folder laid out as a repo root) whose jobs
run out of CUDA memory (test hook LORARL_FAULT=oom_above:1): Snakemake's retries walk the memory ladder,
training and evaluation succeed on attempt 3 (a smaller micro-batch / generation chunk / eval batch, then
gradient checkpointing), each retry is in the logs, summary.json and the MLflow run, and the cell's
signatures are the planned ones (a second `snakemake all` has nothing to do)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorarl.pipeline.drills import recovery
from tests.support.study import TRAIN, seeds, tiny_study

pytestmark = pytest.mark.slow

STUDY = tiny_study("oomy",
                   task={"name": "synthetic", "n_train": 16, "n_eval": 4},
                   train={**TRAIN, "steps": 1, "max_completion_length": 8, "checkpoint_every": 0},
                   eval={"max_new_tokens": 4, "batch_size": 4}, axes=seeds(0))


def test_out_of_memory_jobs_are_retried_down_the_ladder(tmp_path: Path, tiny_test_base: Path):
    from tests.support.trained import place_base

    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    root = recovery.workspace(tmp_path, {"studies": [str(tmp_path / "study.yaml")], "results": "results",
                                         "launcher": "local", "slurm": {}})
    place_base(tiny_test_base, root / "results")  # the session's base model (the hook fails no base job anyway)
    env = {k: v for k, v in os.environ.items() if k != "LORARL_FAULT"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["LORARL_FAULT"] = "oom_above:1"
    log = tmp_path / "snakemake.log"
    rc = recovery.run(recovery.COMMANDS["local"][1], root, env, log, str(tmp_path / "study.yaml"))
    assert rc == 0, log.read_text()[-6000:]

    cdir = root / "results" / "oomy" / "s0"
    summary = json.loads((cdir / "summary.json").read_text())
    assert summary["oom_retries"] == [
        {"attempt": 2, "micro_batch_size": 2, "generation_batch_size": 2, "gradient_checkpointing": False},
        {"attempt": 3, "micro_batch_size": 2, "generation_batch_size": 2, "gradient_checkpointing": True}]
    ev = json.loads((cdir / "eval" / "synthetic.json").read_text())
    assert ev["oom_retries"] == [{"attempt": 2, "eval.batch_size": 2}, {"attempt": 3, "eval.batch_size": 1}]
    train_log = (cdir / "logs" / "train.log").read_text()  # Snakemake's log of the last attempt (3)
    assert "attempt 3 after out of memory in attempt 2" in train_log and "oom_above:1" in train_log
    record = json.loads((cdir / "logs" / "train" / "oom-attempts.json").read_text())
    assert [(e["attempt"], e["oom"]) for e in record] == [(1, True), (2, True)]
    job_out = "".join(p.read_text() for p in (cdir / "logs" / "train").glob("*_log.out"))
    assert "out-of-memory retry, attempt 2: s0: micro_batch_size 4 -> 2, generation_batch_size 4 -> 2" in job_out
    assert "out-of-memory retry, attempt 3: s0: micro_batch_size 4 -> 2, generation_batch_size 4 -> 2, " \
           "gradient_checkpointing False -> True" in job_out

    from lorarl.language.study import cell_table, load_study

    cell = cell_table(load_study(tmp_path / "study.yaml")).cell("s0")
    recorded = json.loads((cdir / "cell.json").read_text())
    assert summary["config_hash"] == recorded["hash"] == cell.hash  # the science: the planned signature
    assert recorded["config"]["train"]["micro_batch_size"] == 2  # what ran
    import mlflow

    run = mlflow.MlflowClient(f"sqlite:///{root / 'results' / 'mlflow.db'}").get_run(summary["mlflow_run_id"])
    assert json.loads(run.data.tags["lorarl.oom_retries"]) == summary["oom_retries"]
    assert json.loads(run.data.tags["lorarl.oom_retries.synthetic"]) == ev["oom_retries"]

    dry = subprocess.run(["snakemake", "all", "-n"], cwd=root, env=env, capture_output=True, text=True)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout + dry.stderr
