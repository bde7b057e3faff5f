"""`lorarl doctor --profile slurm` against the real Slurm test cluster.

Bring the cluster up first (CI does):  bash tests/slurm/cluster.sh up
These tests fail loudly, not skip, when it is not up.

The smoke cell goes through the profile's launcher (submitit -> sbatch) onto the profile's `train`
partition (`gpu`: the test node's fake GPUs, so the job computes on the CPU); the report must say where
it ran (job id, partition, node from sacct) and hold the job's own measurements. As the other Slurm tests
do, the command overrides only what the one test node can give (`--config slurm=...`) and the MLflow store
(`--config tracking=sqlite`: profiles/slurm points at a tracking server).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.study import tiny_study

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm

SLURM = {
    "base": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
    "train": {"partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 1, "mem_gb": 3, "timeout_min": 30},
    "evaluate": {"partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
    "diagnose": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
}


def tiny_model(dest: Path) -> None:
    """A random-weights stand-in for `local:tiny-test` (the doctor finds it and skips the base stage)."""
    import torch

    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-*=?()\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)


def test_doctor_runs_the_smoke_cell_as_a_slurm_job_on_the_train_partition(tmp_path: Path):
    tiny_model(tmp_path / "results" / "models" / "tiny-test")
    study = tiny_study("docsl",
                       train={"steps": 40, "prompts_per_step": 2, "generations": 2, "max_completion_length": 8,
                              "beta": 0.05},
                       eval={"max_new_tokens": 8},
                       axes={"seed": {"field": "seed", "prefix": "s", "values": [0, 1]},
                             "ds": {"field": "train.dynamic_sampling", "prefix": "ds", "values": [False, True]}})
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    cmd = [sys.executable, "-m", "lorarl.cli", "doctor", str(tmp_path / "study.yaml"), "--profile", "slurm",
           "--results", str(tmp_path / "results"), "--steps", "2", "--eval-limit", "2", "--cell", "s1-dsFalse",
           "--config", "tracking=sqlite", "slurm=" + json.dumps(SLURM)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "LORARL_POLL_S": "3"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    ddir = tmp_path / "results" / "docsl" / "doctor"
    rep = json.loads((ddir / "doctor.json").read_text())
    where, m = rep["where"], rep["measured"]
    assert rep["ok"] and rep["profile"]["launcher"] == "slurm" and rep["profile"]["tracking"] == "sqlite"
    job = where["job_id"]
    # the scheduler's record: the profile's train partition, this node, completed
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,JobName,State,Partition,NodeList"],
                           capture_output=True, text=True, timeout=60).stdout.strip()
    jid, name, state, part, node = sacct.splitlines()[-1].split("|")
    assert (jid, state, part) == (job, "COMPLETED", "gpu") and name == "lorarl-doctor-docsl-doctor-s1-dsFalse"
    assert where["partition"] == "gpu" and where["node"] == node == socket.gethostname().split(".")[0]
    assert where["state"] == "COMPLETED" and "cpu=1" in where["alloc"]
    # the job's own view of where it ran, and its measurements
    assert m["job"]["job_id"] == job and m["job"]["partition"] == "gpu" and m["job"]["cuda_visible_devices"]
    checks = {c["check"]: c for c in m["checks"]}
    assert checks["ran on the study's train partition"]["ok"] and checks["MLflow store"]["ok"]
    assert checks["smoke training"]["ok"] and checks["evaluation: synthetic"]["ok"]
    assert m["device"]["kind"] == "cpu" and m["split"]["step_s"] > 0 and m["split"]["reference_forward_s"] > 0
    assert m["evaluation"]["synthetic"]["problems"] == 2
    md = (ddir / "doctor.md").read_text()
    assert md in proc.stdout and f"Slurm job {job}, partition gpu, node {node}, COMPLETED" in md
    # the projection: the study's 4 cells with the profile's GPUs per stage (train 1, diagnose 0)
    p = rep["projection"]
    assert p["cells"] == 4 and p["steps"] == 160 and p["gpus_per_job"] == {"train": 1, "evaluate": 1, "diagnose": 0}
    assert p["gpu_hours"] > 0
    # DAPO cells are charged the expected refill rounds at the smoke's measured degenerate-group rate
    from lorarl.pipeline.doctor.projection import expected_rounds

    rate, rows = m["split"]["degenerate_rate"], {r["cell"]: r for r in p["per_cell"]}
    assert rate is not None and rows["s0-dsFalse"]["rounds_per_rollout"] == 1.0
    assert rows["s0-dsTrue"]["rounds_per_rollout"] == pytest.approx(expected_rounds(rate, 2, 3), abs=1e-3)
    assert set(m["prompt_tokens"]) == set(rows) and "DAPO" in "\n".join(p["assumptions"])
    # submitted through the launcher: provenance of the doctor stage names the job and the partition
    smoke = ddir / "run" / "docsl-doctor" / "s1-dsFalse"
    prov = json.loads((smoke / "provenance" / "doctor.json").read_text())
    (sub,) = prov["submissions"]
    assert sub["executor"] == "slurm" and sub["job_id"] == job and sub["attempts"][0]["partition"] == "gpu"
    assert (smoke / "logs" / "doctor" / f"{job}_0_log.out").exists()
    # the smoke run's MLflow store is its own (sqlite in the smoke folder); the real study is untouched
    assert (ddir / "run" / "mlflow.db").exists() and not (tmp_path / "results" / "mlflow.db").exists()
    assert not (tmp_path / "results" / "docsl" / "s1-dsFalse").exists()


def test_a_check_failing_on_the_node_is_reported_with_where_it_ran(tmp_path: Path):
    """The model exists only 'on compute nodes' (LORARL_SKIP_PATH_CHECKS): it is missing in the job, so the
    load check fails there, nothing long starts, and the report (exit 1) still names the Slurm job."""
    study = tiny_study("docbad", task=None, adapter=None, eval=None, model=str(tmp_path / "no-such-model"),
                       train={"steps": 5, "max_completion_length": 8}, axes=None)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    cmd = [sys.executable, "-m", "lorarl.cli", "doctor", str(tmp_path / "study.yaml"), "--profile", "slurm",
           "--results", str(tmp_path / "results"), "--config", "tracking=sqlite", "slurm=" + json.dumps(SLURM)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "LORARL_POLL_S": "3",
           "LORARL_SKIP_PATH_CHECKS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads((tmp_path / "results" / "docbad" / "doctor" / "doctor.json").read_text())
    checks = {c["check"]: c for c in rep["measured"]["checks"]}
    assert not rep["ok"] and not checks["model and tokenizer load"]["ok"] and "smoke training" not in checks
    assert "no-such-model" in checks["model and tokenizer load"]["detail"] and "projection" not in rep
    assert rep["where"]["partition"] == "gpu" and rep["where"]["state"] == "COMPLETED"  # the job itself ran fine
    assert rep["measured"]["job"]["job_id"] == rep["where"]["job_id"]
    assert f"Slurm job {rep['where']['job_id']}, partition gpu" in proc.stdout and "**NO**" in proc.stdout
