"""Corrupted or half-written checkpoints (lorarl.train.integrity + lorarl.train.checkpoint.resume_run).

Each bad checkpoint is detected, reported (stderr + summary's `checkpoint_problems`) and deleted; the
previous good checkpoint or a fresh start is used; a checkpoint that keeps killing its resumes is
dropped after two tries (no crash loop). Slow: a real trainer killed right after a checkpoint whose
optimizer file is then truncated reruns from scratch to the end, with every step once in MLflow.
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

from lorarl.train import checkpoint, integrity
from lorarl.tracking.client import Tracker
from tests.support.study import TRAIN, seeds, tiny_study


def _cell():
    from lorarl.language.study import study_cells, parse_study

    return study_cells(parse_study(tiny_study("ck", task=None, adapter=None, eval=None, train={"checkpoint_every": 2},
                                              axes=None)))[0]


def _fake_checkpoint(root: Path, step: int, run_id: str, config_hash: str) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(4096))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    meta = {"step": step, "config_hash": config_hash, "mlflow_run_id": run_id, "rows": [],
            "files": integrity.manifest(d)}
    (d / checkpoint.MARKER).write_text(json.dumps(meta))
    return d


@pytest.fixture
def setup(tmp_path: Path):
    cell = _cell()
    tracker = Tracker(tmp_path, "ck")
    run = tracker.start(cell.id, cell.id, tags={}, params={})
    ck = checkpoint.CellCheckpoints(tmp_path, "ck", cell)
    yield ck, tracker, run, cell
    ck.release()


def test_manifest_detects_truncated_missing_and_altered_files(tmp_path: Path):
    d = _fake_checkpoint(tmp_path, 2, "r", "h")
    meta = json.loads((d / checkpoint.MARKER).read_text())
    assert integrity.verify(d, meta) is None
    blob = d / "adapter_model.safetensors"
    data = blob.read_bytes()
    blob.write_bytes(data[:100])
    assert "4096 expected" in integrity.verify(d, meta)
    blob.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, one bit flipped
    assert "sha256" in integrity.verify(d, meta)
    blob.unlink()
    assert "missing" in integrity.verify(d, meta)


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(setup, capsys):
    ck, tracker, run, cell = setup
    _fake_checkpoint(ck.root, 2, run, cell.hash)
    bad = _fake_checkpoint(ck.root, 4, run, cell.hash)
    with open(bad / "adapter_model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    (ck.root / "checkpoint-6").mkdir()  # a save cut short: no mark
    assert ck.resume_run(tracker) == run
    assert ck.resumed.step == 2 and ck.resume_from.endswith("checkpoint-2")
    assert not bad.exists() and not (ck.root / "checkpoint-6").exists()
    probs = ck.summary()["checkpoint_problems"]
    assert len(probs) == 2 and "checkpoint-4 not used: adapter_model.safetensors has 1000 bytes" in probs[0]
    assert "checkpoint-6 not used: no lorarl.json mark" in probs[1]
    assert "checkpoint problem" in capsys.readouterr().err


def test_checkpoint_of_another_config_means_a_fresh_start(setup):
    ck, tracker, run, cell = setup
    _fake_checkpoint(ck.root, 4, run, "another-config")
    assert ck.resume_run(tracker) is None and ck.resumed is None
    assert "another config (another-config" in ck.summary()["checkpoint_problems"][0]
    assert checkpoint.complete_checkpoints(ck.root) == []


def test_a_checkpoint_that_kills_its_resumes_is_dropped_after_two_tries(setup):
    ck, tracker, run, cell = setup
    d = _fake_checkpoint(ck.root, 4, run, cell.hash)
    for attempt in (1, 2):  # two runs load it and die before finishing a step
        assert ck.resume_run(tracker) == run, attempt
        assert integrity.failed_resumes(d) == attempt
        ck.resumed, ck.problems = None, []
    assert ck.resume_run(tracker) is None  # third time: not tried again, fresh start
    assert "2 runs in a row died resuming from it" in ck.summary()["checkpoint_problems"][0]

    d = _fake_checkpoint(ck.root, 6, run, cell.hash)
    ck.problems = []
    assert ck.resume_run(tracker) == run and integrity.failed_resumes(d) == 1
    integrity.resume_worked(d)  # a step completed after loading it: the count starts over
    assert integrity.failed_resumes(d) == 0


# ---- slow: a real trainer ---------------------------------------------------------------------

STUDY = tiny_study("ck", eval=None, train={**TRAIN, "steps": 4, "checkpoint_every": 2}, axes=seeds(0))


@pytest.mark.slow
def test_truncated_checkpoint_after_a_kill_reruns_from_scratch(tmp_path: Path, tiny_test_base: Path):
    import mlflow

    from tests.support.trained import place_base

    place_base(tiny_test_base, tmp_path)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    cmd = [sys.executable, "-m", "lorarl.cli", "run", str(tmp_path / "study.yaml"), "s0", "--stages", "train",
           "--results", str(tmp_path), "--threads", "1"]
    env = {**os.environ, checkpoint.FAULT_ENV: "kill_after_save:2"}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    root = tmp_path / "ck" / ".checkpoints" / "s0"
    (c2,) = checkpoint.complete_checkpoints(root)
    opt = c2.path / "optimizer.pt"
    assert opt.exists() and "optimizer.pt" in c2.meta["files"]
    with open(opt, "r+b") as fh:
        fh.truncate(opt.stat().st_size // 2)

    env.pop(checkpoint.FAULT_ENV)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "checkpoint-2 not used: optimizer.pt has" in second.stderr and "resuming from" not in second.stdout
    summary = json.loads((tmp_path / "ck" / "s0" / "summary.json").read_text())
    assert summary["resumed_from_steps"] == [] and len(summary["checkpoint_problems"]) == 1
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert c2.run_id != summary["mlflow_run_id"]
    assert client.get_run(c2.run_id).info.lifecycle_stage == "deleted"  # the half-run is superseded
    steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "loss")]
    assert sorted(steps) == [1, 2, 3, 4]
