"""lorarl.train.salvage: a published cell keeps hard links to its outputs; a later job of the same config puts them
back instead of retraining only when they were published after its Snakemake run started, or that run's onstart
allowed it (a rerun for a killed run's incomplete marks alone); and through Snakemake, a SIGKILLed run's orphaned
train job that finished is not trained twice."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lorarl import paths
from lorarl.train import salvage
from tests.support.study import TRAIN, seeds, tiny_study

HASH = "abc123"


def invocation(started: float) -> str:
    return f"host-123-{int(started)}"


def published(res: Path, cell: str = "c0", config_hash: str = HASH) -> Path:
    d = paths.cell_dir(res, "st", cell)
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    (d / "adapter" / "adapter_config.json").write_text("{}")
    (d / "metrics.csv").write_text("step,reward\n1,0.5\n")
    (d / "cell.json").write_text(json.dumps({"id": cell}))
    (d / "summary.json").write_text(json.dumps({"config_hash": config_hash, "state": "done", "resumed_from_steps": [2]}))
    salvage.keep_published(res, "st", cell, config_hash)
    return d


def snakemake_removes_outputs(d: Path) -> None:
    """What Snakemake does before it runs a job: its declared outputs go."""
    for name in paths.CELL_OUTPUTS:
        p = d / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def test_published_after_the_run_started_is_put_back_whole(tmp_path):
    """The orphan finished after the rerun built its DAG; Snakemake removed the outputs before the rerun's job."""
    started = time.time() - 5
    d = published(tmp_path)
    weights = d / "adapter" / "adapter_model.safetensors"
    kept = d / salvage.SALVAGED
    assert (kept / "adapter" / "adapter_model.safetensors").stat().st_ino == weights.stat().st_ino  # no copy
    snakemake_removes_outputs(d)
    summary = salvage.restore(tmp_path, "st", "c0", HASH, invocation(started))
    assert summary == {"config_hash": HASH, "state": "done", "resumed_from_steps": [2]}
    assert weights.read_bytes() == b"weights" and (d / "metrics.csv").read_text() == "step,reward\n1,0.5\n"
    assert json.loads((d / "summary.json").read_text()) == summary
    assert (kept / "summary.json").stat().st_ino == (d / "summary.json").stat().st_ino  # kept again


def test_outputs_there_at_the_start_retrain_unless_onstart_allowed(tmp_path):
    """--forcerun (or changed code) of outputs that were there when the run started: dropped, retrained; the same
    outputs rerun only for a killed run's incomplete marks (onstart's allow): put back."""
    d = published(tmp_path)
    later = time.time() + 5
    snakemake_removes_outputs(d)
    assert salvage.restore(tmp_path, "st", "c0", HASH, invocation(later)) is None
    assert not (d / salvage.SALVAGED).exists()

    d = published(tmp_path, "c1")
    assert salvage.allow(tmp_path, "st", "c1", HASH, invocation(later))
    snakemake_removes_outputs(d)
    assert salvage.restore(tmp_path, "st", "c1", HASH, invocation(later + 60)) is None  # another run: not allowed
    d = published(tmp_path, "c2")
    assert salvage.allow(tmp_path, "st", "c2", HASH, invocation(later))
    snakemake_removes_outputs(d)
    assert salvage.restore(tmp_path, "st", "c2", HASH, invocation(later))["state"] == "done"
    assert salvage.restore(tmp_path, "st", "c2", HASH, None) is None  # no run named: nothing put back


def test_nothing_kept_for_outputs_that_are_not_whole_or_of_another_config(tmp_path):
    d = published(tmp_path, config_hash="other")
    snakemake_removes_outputs(d)
    assert salvage.restore(tmp_path, "st", "c0", HASH, invocation(0)) is None and not (d / salvage.SALVAGED).exists()
    d = published(tmp_path, "c1")
    shutil.rmtree(d / salvage.SALVAGED)
    shutil.rmtree(d / "adapter")  # the job was killed before it published its adapter
    assert not salvage.keep_published(tmp_path, "st", "c1", HASH) and not (d / salvage.SALVAGED).exists()
    assert not salvage.allow(tmp_path, "st", "c1", HASH, invocation(0))


def test_invocation_start_is_read_from_the_run_name():
    assert salvage.invocation_start("node-7.cluster-4242-1796000000") == 1796000000.0
    assert salvage.invocation_start(None) is None and salvage.invocation_start("odd") is None


STUDY = tiny_study("fl", eval=None, train={**TRAIN, "steps": 4, "checkpoint_every": 2}, axes=seeds(0))


@pytest.mark.slow
def test_a_train_job_that_finishes_after_snakemake_is_killed_is_kept_not_retrained(tmp_path: Path, tiny_test_base):
    """Snakemake SIGKILLed while a cell trains (its launcher and job go on, orphaned, and finish): the rerun forces
    the job for the killed run's "incomplete" marks on its now whole outputs and would delete them; its onstart
    lets the job put them back (lorarl.train.salvage), so the cell is not trained twice: the same summary and MLflow
    run. Only the train job's own output is asked for (no evaluation jobs)."""
    from lorarl.pipeline.drills import faults, recovery
    from tests.support.trained import place_base

    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    root = recovery.workspace(tmp_path, {"studies": [str(tmp_path / "study.yaml")], "results": "results",
                                         "launcher": "local", "slurm": {}})
    place_base(tiny_test_base, root / "results")  # the session's base model: Snakemake's first job is the train job
    target, log = "results/fl/s0/summary.json", tmp_path / "snakemake.log"
    train_log = root / "results" / "fl" / "s0" / "logs" / "train.log"
    cmd = [sys.executable, "-m", "snakemake", target]

    def said(text: str) -> bool:
        return train_log.exists() and text in train_log.read_text()

    with open(log, "a") as fh:
        proc = subprocess.Popen(cmd, cwd=root, env=faults._env(), stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while not said("submitted job") and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert said("submitted job") and proc.poll() is None, log.read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)  # Snakemake alone: its launcher and job go on
    proc.wait()
    while not said("done in") and time.time() < deadline:  # the orphaned launcher saw its job finish
        time.sleep(0.2)
    summary = (root / target).read_text()
    assert said("done in") and any((tmp_path / ".snakemake" / "incomplete").iterdir())

    for args in (["--unlock"], [target]):
        rerun = subprocess.run([*cmd[:3], *args], cwd=root, env=faults._env(), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    out = rerun.stdout + rerun.stderr
    assert "[lorarl] fl/s0: finished by a job of the killed run" in out and "Rule: train" in out, out[-3000:]
    assert (root / target).read_text() == summary  # put back, not retrained
    assert "by a job of a killed Snakemake run" in "".join(
        p.read_text() for p in (train_log.parent / "train").glob("*_log.out"))
