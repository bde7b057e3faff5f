"""A pack job on the real Slurm test cluster, preempted (issue 14): Slurm's USR2 (what preemption
sends; submitit requeues) makes every member checkpoint, the requeued job resumes each member from its
own checkpoint, and each cell ends with every (metric, step) exactly once in metrics.csv and in its one
MLflow run. Then `scontrol requeue` (SIGTERM, no checkpoint call) and the same guarantees."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType

from tests.slurm.test_pipeline_slurm import (REPO, env, mlflow_client, models,  # noqa: F401
                                             snakemake_cmd, study, wait_progress, workdir_for)

pytestmark = pytest.mark.slurm
CELLS = ("s0", "s1")


def _wait(wd: Path, min_step: int, not_pid: int | None, proc: subprocess.Popen) -> dict:
    """Progress of both members at step >= min_step, written by a process other than `not_pid`."""
    return wait_progress([wd / "results" / "pk" / ".checkpoints" / c / "progress.json" for c in CELLS], min_step,
                         not_pid, proc)


def test_preempted_pack_requeues_and_resumes_every_member_exactly_once(models, tmp_path: Path):
    steps = 36
    spec = study("pk", {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}, steps=steps, checkpoint_every=4)
    wd = workdir_for(tmp_path, models, spec)
    log = (tmp_path / "snakemake.log").open("w")
    proc = subprocess.Popen(snakemake_cmd(wd) + ["pack=2"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=env())
    try:
        p = _wait(wd, 4, None, proc)
        job = p["job_id"]
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)  # what preemption does
        p = _wait(wd, p["step"] + 4, p["pid"], proc)  # requeued, every member resumed, trained on
        assert p["job_id"] == job  # the same (requeued) job
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)  # SIGTERM, no checkpoint() call
        _wait(wd, p["step"] + 2, p["pid"], proc)
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert rc == 0, (tmp_path / "snakemake.log").read_text()[-5000:]
    res = wd / "results" / "pk"
    (record,) = (res / ".packs").glob("pack-*.json")
    rec = json.loads(record.read_text())
    assert rec["trained"] == list(CELLS) and rec["states"] == {c: "done" for c in CELLS}, rec
    client = mlflow_client(wd)
    exp = client.get_experiment_by_name("pk")
    for c in CELLS:
        d = res / c
        summary = json.loads((d / "summary.json").read_text())
        assert summary["pack"]["members"] == list(CELLS) and summary["state"] == "done"
        assert len(summary["resumed_from_steps"]) == 2 and all(s >= 4 for s in summary["resumed_from_steps"]), summary
        assert pd.read_csv(d / "metrics.csv")["step"].tolist() == list(range(1, steps + 1))
        runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`lorarl.cell_id` = '{c}'",
                                  run_view_type=ViewType.ALL)
        assert [r.info.run_id for r in runs] == [summary["mlflow_run_id"]]  # one run, resumed twice
        for key in ("reward", "loss"):
            got = sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], key))
            assert got == list(range(1, steps + 1)), (c, key, got)
        assert (d / "adapter" / "adapter_model.safetensors").exists() and not (d / ".packed").exists()
        assert not (res / ".checkpoints" / c).exists()
