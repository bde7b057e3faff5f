"""MLflow live and tidy (real sqlite stores): a running cell shows each step at once, under ``live/<key>`` while no
checkpoint covers it, under its own key when the cell has no checkpoints; a kill and a resume keep every step once
in both; a run whose process is gone is ended KILLED (lorarl.tracking.dead_runs), never left RUNNING.

The trainer-level kill -9 (a real training subprocess, resumed twice) is tests/train/test_resume.py's slow test."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
from pathlib import Path

from lorarl.tracking import dead_runs
from lorarl.tracking.client import Tracker
from lorarl.train.callbacks import MetricsRecorder
from lorarl.train.checkpoint import CellCheckpoints, Checkpoint
from tests.support.study import seeds, tiny_study


def _history(t: Tracker, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in t.client.get_metric_history(t.run_id, key))


def _cell():
    from lorarl.language.study import parse_study, study_cells

    return study_cells(parse_study({"name": "st", "defaults": {"model": "local:tiny-test"}}))[0]


def _row(step: int, attempt: int) -> dict[str, float]:
    return {"step": step, "reward": step + attempt / 10, "loss": -step}


def test_checkpointed_cell_shows_each_step_live_and_its_own_keys_once_across_a_kill(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    run = t.start("c", "c", tags={}, params={})
    rec = MetricsRecorder(tmp_path / "metrics.csv", t, live_every_s=0)  # every step at once
    rec.log_only_saved = True  # as lorarl.train.checkpoint.restore sets it for a cell with checkpoints
    for s in (1, 2):
        rec.record(_row(s, 0))
    assert _history(t, "live/reward") == [(1, 1.0), (2, 2.0)]  # at once, not at the checkpoint
    assert _history(t, "reward") == [] and not (tmp_path / "metrics.csv").exists()
    rec.flush()  # the checkpoint at step 2 covers steps 1-2
    assert _history(t, "reward") == [(1, 1.0), (2, 2.0)]
    rec.record(_row(3, 0))  # step 3 shown live, then the process is killed before the next checkpoint
    assert _history(t, "live/reward")[-1] == (3, 3.0) and _history(t, "reward")[-1] == (2, 2.0)

    t2 = Tracker(tmp_path, "st")  # the next attempt: resumes from checkpoint-2 and trains step 3 again
    t2.resume(run)
    rec2 = MetricsRecorder(tmp_path / "metrics.csv", t2, live_every_s=0)
    ckpt = CellCheckpoints(tmp_path, "st", _cell())
    ckpt.resumed = Checkpoint(tmp_path / "checkpoint-2", 2, {"mlflow_run_id": run, "rows": [_row(1, 0), _row(2, 0)]})
    ckpt.restore(rec2, run)  # re-sends the checkpoint's rows: all at or below their keys' high-water marks
    ckpt.release()
    assert rec2.log_only_saved and _history(t2, "live/reward") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    for s in (3, 4):
        rec2.record(_row(s, 1))
    rec2.flush()
    assert _history(t2, "reward") == [(1, 1.0), (2, 2.0), (3, 3.1), (4, 4.1)]  # the retrained value, once
    assert _history(t2, "loss") == [(s, -s) for s in (1, 2, 3, 4)]
    # live: each step once; step 3 keeps the value the killed attempt showed
    assert _history(t2, "live/reward") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.1)]
    with open(tmp_path / "metrics.csv") as fh:
        assert [int(r["step"]) for r in csv.DictReader(fh)] == [1, 2, 3, 4]  # the files: each step once


def test_live_batches_wait_their_interval_and_a_checkpoint_sends_the_rest(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    t.start("c", "c", tags={}, params={})
    rec = MetricsRecorder(tmp_path / "metrics.csv", t, live_every_s=3600)
    rec.log_only_saved = True
    for s in (1, 2, 3):
        rec.record(_row(s, 0))
    assert _history(t, "live/reward") == [(1, 1.0)]  # the first at once; the next within the hour
    rec.flush()  # a checkpoint: live first, then the own keys
    assert _history(t, "live/reward") == _history(t, "reward") == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_cell_without_checkpoints_logs_its_own_keys_at_once(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    t.start("c", "c", tags={}, params={})
    rec = MetricsRecorder(tmp_path / "metrics.csv", t, flush_every=10, live_every_s=0)
    for s in (1, 2, 3):
        rec.record(_row(s, 0))
    assert _history(t, "reward") == [(1, 1.0), (2, 2.0), (3, 3.0)]  # before metrics.csv's flush every 10 steps
    assert _history(t, "live/reward") == [] and not (tmp_path / "metrics.csv").exists()
    rec.flush()
    assert _history(t, "reward") == [(1, 1.0), (2, 2.0), (3, 3.0)]  # not twice
    follower = MetricsRecorder(tmp_path / "other.csv", t, write=False)  # a rank other than 0 sends nothing
    follower.record(_row(4, 0))
    assert _history(t, "reward")[-1] == (3, 3.0)


HOLDER = """
import fcntl, sys, time
fh = open(sys.argv[1], "a+")
fcntl.flock(fh, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def _lock_file(results: Path, study: str, cell: str) -> Path:
    lock = dead_runs.lock_path(results, study, cell)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    return lock


def test_run_of_a_killed_trainer_is_ended_killed_and_reopened_by_the_next_attempt(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    run = t.start("c", "c", tags={}, params={})
    other = Tracker(tmp_path, "st").start("d", "d", tags={}, params={})  # a cell with no lock file: left alone
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(_lock_file(tmp_path, "st", "c"))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert dead_runs.end_dead_runs(t, "test") == []  # the trainer holds the cell's lock: alive
        assert t.client.get_run(run).info.status == "RUNNING"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    assert dead_runs.end_dead_runs(t, "test", cells=["d"]) == []  # only the cells asked about
    assert dead_runs.end_dead_runs(t, "job 7 ended FAILED") == [run]  # its process is gone: the lock is free
    got = t.client.get_run(run)
    assert got.info.status == "KILLED" and got.data.tags["lorarl.state"] == "killed"
    assert got.data.tags["lorarl.killed_reason"] == "job 7 ended FAILED"
    assert t.client.get_run(other).info.status == "RUNNING"
    assert dead_runs.end_dead_runs(t, "again") == []  # ended once

    t2 = Tracker(tmp_path, "st")
    t2.resume(run)  # the next attempt reopens it and counts the attempt that died
    got = t2.client.get_run(run)
    assert got.info.status == "RUNNING" and got.data.tags["lorarl.state"] == "running"
    assert got.data.tags["lorarl.killed_attempts"] == "1"
    Tracker(tmp_path, "st").resume(run)  # killed again, never ended by anyone: still RUNNING when it reopens
    assert t2.client.get_run(run).data.tags["lorarl.killed_attempts"] == "2"
    t2.finish("KILLED", state="preempted")  # a preemption ends its own run: no kill to count on the resume
    Tracker(tmp_path, "st").resume(run)
    assert t2.client.get_run(run).data.tags["lorarl.killed_attempts"] == "2"


def test_a_fresh_start_ends_the_dead_run_it_supersedes(tmp_path: Path):
    t = Tracker(tmp_path, "st")
    first = t.start("c", "c", tags={}, params={})
    Tracker(tmp_path, "st").start("c", "c", tags={}, params={})
    got = t.client.get_run(first)
    assert got.info.status == "KILLED" and got.data.tags["lorarl.state"] == "killed"
    assert got.data.tags["lorarl.superseded"] == "true" and got.info.lifecycle_stage == "deleted"


def test_launcher_ends_the_runs_of_its_failed_job(tmp_path: Path):
    assert dead_runs.after_job(tmp_path, "st", ["c"], "job 1 ended FAILED") == []
    assert not (tmp_path / "mlflow.db").exists()  # no store yet: none made
    t = Tracker(tmp_path, "st")
    runs = {c: Tracker(tmp_path, "st").start(c, c, tags={}, params={}) for c in ("a", "b")}
    for c in runs:
        _lock_file(tmp_path, "st", c)
    assert dead_runs.after_job(tmp_path, "st", ["a"], "job 1 ended OUT_OF_MEMORY (its launcher)") == [runs["a"]]
    assert t.client.get_run(runs["a"]).data.tags["lorarl.killed_reason"] == "job 1 ended OUT_OF_MEMORY (its launcher)"
    assert t.client.get_run(runs["b"]).info.status == "RUNNING"  # another job's cell


STUDY = tiny_study("lv", adapter=None, eval=None, task={"name": "synthetic", "n_train": 16, "n_eval": 4},
                   train={"steps": 2, "prompts_per_step": 2, "generations": 2,
                          "max_completion_length": 8},
                   axes=seeds(0))


def test_a_train_job_that_dies_has_its_run_ended_by_its_launcher(tmp_path: Path, monkeypatch, capsys):
    """`lorarl launch train`: the job (no scheduler here) ends without a result; the cell's run is KILLED."""
    import yaml
    from types import SimpleNamespace

    from lorarl.pipeline.jobs import launch

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    run = Tracker(tmp_path, "lv").start("s0", "s0", tags={}, params={})  # the attempt's run, then SIGKILL
    _lock_file(tmp_path, "lv", "s0")

    class Executor:
        def __init__(self, kind, folder, *a, **k):
            self.folder = Path(folder)

        def submit(self, fn):
            return SimpleNamespace(job_id="9", paths=SimpleNamespace(folder=self.folder,
                                                                     stderr=self.folder / "9_0_log.err"))

    monkeypatch.setattr(launch, "make_executor", Executor)
    monkeypatch.setattr(launch, "_wait", lambda job, *a: RuntimeError("job 9 ended without a result"))
    monkeypatch.setattr(launch, "final_state", lambda job, executor: {"State": "OUT_OF_MEMORY"})
    assert launch.launch("train", str(study), "s0", str(tmp_path), executor="local") == 1
    got = Tracker(tmp_path, "lv").client.get_run(run)
    assert got.info.status == "KILLED"
    assert got.data.tags["lorarl.killed_reason"] == "job 9 ended OUT_OF_MEMORY (its launcher)"
    assert "its process is gone" in capsys.readouterr().err


def test_sync_mlflow_ends_a_dead_run_of_an_unfinished_cell(tmp_path: Path):
    import yaml

    from lorarl.pipeline.studyrun.sync import sync_study

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    run = Tracker(tmp_path, "lv").start("s0", "s0", tags={}, params={})
    _lock_file(tmp_path, "lv", "s0")
    assert sync_study(study, tmp_path) == []  # nothing finished to replay
    got = Tracker(tmp_path, "lv").client.get_run(run)
    assert got.info.status == "KILLED" and got.data.tags["lorarl.killed_reason"] == "seen by lorarl sync-mlflow"
