"""Checkpoint → kill → resume without Slurm (lorarl.train.checkpoint, the MLflow high-water mark, train_cell).

Fast: the MLflow de-duplication and checkpoint bookkeeping on their own. Slow (`slow`): the trainer in
a subprocess is SIGKILLed right after a checkpoint and between two checkpoints, rerun each time, and
the result must equal an uninterrupted run on the same seed: one MLflow run, every step exactly once,
metrics.csv continuous, the same final adapter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorarl.train import checkpoint
from lorarl.tracking.client import Tracker
from tests.support.resume import build_models
from tests.support.study import seeds, tiny_study

REPO = Path(__file__).resolve().parents[2]
CORE = ["reward", "reward_std", "loss", "grad_norm", "entropy", "learning_rate", "num_tokens"]


# ---- fast ---------------------------------------------------------------------------------------

def _history(tracker: Tracker, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracker.client.get_metric_history(tracker.run_id, key))


def test_resumed_tracker_never_logs_a_step_twice(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    run = t.start("c", "c", tags={}, params={})
    t.log_metrics([{"step": s, "reward": s / 10, "loss": -s} for s in (1, 2, 3)])
    # a kill in the middle of a batch: step 4 reached MLflow for `reward` only
    t.log_metrics([{"step": 4, "reward": 0.4}])
    t.finish("KILLED")

    t2 = Tracker(tmp_path, "st")
    t2.resume(run)
    assert t2.logged == {"reward": 4, "loss": 3} and t2.high_water == 4
    assert t2.client.get_run(run).info.status == "RUNNING"
    # the resumed process re-sends everything from its checkpoint (steps 1-4), then goes on
    t2.log_metrics([{"step": s, "reward": s / 10, "loss": -s} for s in (1, 2, 3, 4, 5)])
    t2.log_summary({"final_train_reward": 0.5})
    assert _history(t2, "reward") == [(s, s / 10) for s in (1, 2, 3, 4, 5)]
    assert _history(t2, "loss") == [(s, -s) for s in (1, 2, 3, 4, 5)]

    t3 = Tracker(tmp_path, "st")  # killed while writing the final outputs, resumed at the last step
    t3.resume(run)
    t3.log_metrics([{"step": 5, "reward": 0.5, "loss": -5}])
    t3.log_summary({"final_train_reward": 0.5, "wall_time_s": 3.0})
    assert _history(t3, "final_train_reward") == [(0, 0.5)] and _history(t3, "wall_time_s") == [(0, 3.0)]
    assert len(_history(t3, "reward")) == 5


def test_resume_refuses_a_deleted_run(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    run = t.start("c", "c", tags={}, params={})
    t.start("c", "c", tags={}, params={})  # a fresh start supersedes (deletes) the first run
    with pytest.raises(RuntimeError, match="deleted"):
        Tracker(tmp_path, "st").resume(run)


def test_only_checkpoints_with_their_mark_count(tmp_path: Path):
    for step, marked in ((2, True), (4, True), (6, False)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        if marked:
            (d / checkpoint.MARKER).write_text(json.dumps({"step": step, "mlflow_run_id": "r", "rows": []}))
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / checkpoint.MARKER).write_text("{not json")  # torn write
    assert [c.step for c in checkpoint.complete_checkpoints(tmp_path)] == [2, 4]
    assert checkpoint.complete_checkpoints(tmp_path / "missing") == []


def test_one_trainer_per_cell(tmp_path: Path):
    from lorarl.language.study import study_cells, parse_study

    cell = study_cells(parse_study({"name": "lk", "defaults": {"model": "local:tiny-test"}}))[0]
    first = checkpoint.CellCheckpoints(tmp_path, "lk", cell)
    code = ("import sys; from lorarl.train import checkpoint; from lorarl.language.study import study_cells, parse_study;"
            "c = study_cells(parse_study({'name': 'lk', 'defaults': {'model': 'local:tiny-test'}}))[0];"
            f"checkpoint.CellCheckpoints({str(tmp_path)!r}, 'lk', c)")
    env = {**os.environ, checkpoint.LOCK_WAIT_ENV: "0"}  # give up at once (default: wait up to 600 s)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "being trained by another process" in proc.stderr
    waiter = subprocess.Popen([sys.executable, "-c", code + "; print('got the lock')"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**env, checkpoint.LOCK_WAIT_ENV: "120"})
    import time

    time.sleep(3)
    assert waiter.poll() is None  # a second job of the cell waits for the first instead of failing
    first.release()
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and "got the lock" in out and "waiting for it" in err
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


# ---- slow: real training in subprocesses ----------------------------------------------------------

STEPS, EVERY = 8, 2


def study_dict(name: str, teacher: Path, **train) -> dict:
    return tiny_study(name, eval=None,
                      train={"steps": STEPS, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16,
                             "lr": 1e-3, "checkpoint_every": EVERY, **train},
                      reward={"regime": "distillation", "teacher": str(teacher)}, axes=seeds(3))


def run_train(study: Path, results: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != checkpoint.FAULT_ENV}
    if fault:
        env[checkpoint.FAULT_ENV] = fault
    cmd = [sys.executable, "-m", "lorarl.cli", "run", str(study), "s3", "--stages", "train",
           "--results", str(results), "--threads", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def adapter_tensors(cell_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(cell_dir / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_test_base: Path) -> tuple[Path, Path]:
    return build_models(tmp_path_factory.mktemp("resume_models"), tiny_test_base)


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> Path:
    """The uninterrupted run (keeping its last checkpoint: test_kept_checkpoint_... reruns a copy)."""
    base, teacher = models
    root = tmp_path_factory.mktemp("reference")
    (root / "models").mkdir()
    os.symlink(base, root / "models" / "tiny-test")
    study = root / "study.yaml"
    study.write_text(yaml.safe_dump(study_dict("resume", teacher, keep_checkpoint=True)))
    proc = run_train(study, root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "resume" / "s3"


@pytest.mark.slow
def test_kill_after_a_checkpoint_and_between_checkpoints_then_rerun(models, reference, tmp_path: Path):
    import mlflow
    import pandas as pd
    import torch

    base, teacher = models
    (tmp_path / "models").mkdir()
    os.symlink(base, tmp_path / "models" / "tiny-test")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(study_dict("resume", teacher)))
    ckpts = tmp_path / "resume" / ".checkpoints" / "s3"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")

    # 1. killed right after checkpoint-4 is complete, before its steps reach MLflow
    first = run_train(study, tmp_path, fault="kill_after_save:4")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert [c.step for c in checkpoint.complete_checkpoints(ckpts)] == [4]
    run_id = checkpoint.complete_checkpoints(ckpts)[-1].run_id
    assert [m.step for m in client.get_metric_history(run_id, "reward")] == [1, 2]  # MLflow lags behind
    live = _steps(client, run_id, "live/reward")  # ... but showed the steps live: the checkpoint's and maybe more
    assert live[:2] == [1, 2] and live == list(range(1, len(live) + 1)) and len(live) <= 4, live
    assert not (tmp_path / "resume" / "s3" / "summary.json").exists()
    assert client.get_run(run_id).info.status == "RUNNING"  # the dead process could not end its run
    from lorarl.tracking.dead_runs import end_dead_runs

    assert end_dead_runs(Tracker(tmp_path, "resume"), "the test saw it die") == [run_id]  # its lock is free
    dead = client.get_run(run_id)
    assert dead.info.status == "KILLED" and dead.data.tags["lorarl.state"] == "killed"

    # 2. rerun: resumes at 4 (MLflow gets 3-4 from the checkpoint), killed at the end of step 7,
    #    i.e. after checkpoint-6 and with step 7 computed but not yet covered by a checkpoint
    second = run_train(study, tmp_path, fault="kill_at_step:7")
    assert second.returncode == -signal.SIGKILL, second.stderr[-3000:]
    assert "resuming from" in second.stdout + second.stderr
    assert [c.step for c in checkpoint.complete_checkpoints(ckpts)] == [6]
    assert checkpoint.progress(ckpts)["step"] == 7
    assert sorted(m.step for m in client.get_metric_history(run_id, "reward")) == [1, 2, 3, 4, 5, 6]
    assert _steps(client, run_id, "live/reward") == [1, 2, 3, 4, 5, 6]  # step 7 was killed before it was recorded
    assert client.get_run(run_id).data.tags["lorarl.killed_attempts"] == "1"

    # 3. rerun to the end
    third = run_train(study, tmp_path)
    assert third.returncode == 0, third.stderr[-4000:]
    cell = tmp_path / "resume" / "s3"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["mlflow_run_id"] == run_id and summary["resumed_from_steps"] == [4, 6]
    assert not ckpts.exists()  # removed once the cell completed

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.lifecycle_stage == "active"
    assert run.data.tags["lorarl.killed_attempts"] == "2" and run.data.tags["lorarl.state"] == "done"
    assert _steps(client, run_id, "live/reward") == list(range(1, STEPS + 1))  # live keys: each step once too
    for key in CORE + ["step_time_s"]:
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(1, STEPS + 1)), (key, steps)  # continuous, no duplicate
    metrics = pd.read_csv(cell / "metrics.csv")
    assert metrics["step"].tolist() == list(range(1, STEPS + 1))
    assert len(client.get_metric_history(run_id, "final_train_reward")) == 1

    ref = pd.read_csv(reference / "metrics.csv")
    for key in CORE:
        assert (metrics[key] - ref[key]).abs().max() <= 1e-5 * max(1.0, ref[key].abs().max()), key
    mlflow_reward = [m.value for m in sorted(client.get_metric_history(run_id, "reward"), key=lambda m: m.step)]
    assert mlflow_reward == pytest.approx(metrics["reward"].tolist(), abs=1e-6)
    got, want = adapter_tensors(cell), adapter_tensors(reference)
    assert got.keys() == want.keys()
    assert max(float((want[k]).abs().max()) for k in want if "lora_B" in k) > 1e-4  # it did learn
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_kept_checkpoint_never_resumes_a_finished_cell(reference, tmp_path: Path):
    """keep_checkpoint: the last checkpoint stays (marked complete); a forced rerun (its outputs removed, as
    Snakemake's --forcerun does) starts afresh."""
    import shutil

    import mlflow

    root = tmp_path / "copy"
    shutil.copytree(reference.parents[1], root, symlinks=True)
    ckpts = root / "resume" / ".checkpoints" / "s3"
    assert [c.step for c in checkpoint.complete_checkpoints(ckpts)] == [STEPS]
    assert (ckpts / checkpoint.COMPLETE).exists()
    first = json.loads((root / "resume" / "s3" / "summary.json").read_text())
    (root / "resume" / "s3" / "summary.json").unlink()  # --forcerun: Snakemake removes the outputs before the job
    # (with them in place a job trains nothing: tests/train/test_adaptive_until.py, a lost launcher's late job)

    proc = run_train(root / "study.yaml", root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" not in proc.stdout + proc.stderr
    second = json.loads((root / "resume" / "s3" / "summary.json").read_text())
    assert second["mlflow_run_id"] != first["mlflow_run_id"] and second["resumed_from_steps"] == []
    client = mlflow.MlflowClient(f"sqlite:///{root}/mlflow.db")
    assert client.get_run(first["mlflow_run_id"]).info.lifecycle_stage == "deleted"  # superseded
    assert [c.step for c in checkpoint.complete_checkpoints(ckpts)] == [STEPS]  # the new run's, kept


@pytest.mark.slow
def test_killed_after_the_last_checkpoint_trains_no_step_more(models, tmp_path: Path):
    """Killed right after the last step's checkpoint (while the outputs are written): the rerun resumes
    at the end and trains nothing (HF's Trainer alone would train step N+1: a row too many)."""
    import mlflow
    import pandas as pd

    base, teacher = models
    (tmp_path / "models").mkdir()
    os.symlink(base, tmp_path / "models" / "tiny-test")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(study_dict("resume", teacher, steps=4)))
    first = run_train(study, tmp_path, fault="kill_after_save:4")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    second = run_train(study, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    cell = tmp_path / "resume" / "s3"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["resumed_from_steps"] == [4] and summary["steps"] == 4, summary
    assert pd.read_csv(cell / "metrics.csv")["step"].tolist() == [1, 2, 3, 4]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for key in CORE:
        assert sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], key)) == [1, 2, 3, 4], key
    assert (cell / "adapter" / "adapter_model.safetensors").exists()
