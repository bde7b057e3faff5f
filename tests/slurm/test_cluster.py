"""End-to-end checks of submitit against the real Slurm test cluster.

Bring the cluster up first (CI does):  bash tests/slurm/cluster.sh up
These tests fail loudly, not skip, when it is not up.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import slurm_jobs  # noqa: E402  (importable the same way inside the jobs, see _executor)

pytestmark = pytest.mark.slurm

JOB_TIMEOUT_S = 240  # no single job here should take longer (loaded 2-core CI included); a hang fails the test


def _executor(tmp_path: Path, partition: str, **params: Any) -> submitit.AutoExecutor:
    # A fresh folder per test: job ids restart at 1 on every `cluster.sh up`,
    # so a reused folder would hand back stale results.
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    defaults: dict[str, Any] = {
        "timeout_min": 10,
        "mem_gb": 1,
        # submitit pickles slurm_jobs.* by reference: make that module importable in the job.
        "slurm_setup": [f"export PYTHONPATH={HERE}${{PYTHONPATH:+:$PYTHONPATH}}"],
    }
    executor.update_parameters(slurm_partition=partition, **{**defaults, **params})
    return executor


def _bounded(fn: Callable[[], Any], timeout_s: float = JOB_TIMEOUT_S) -> Any:
    """Run fn() in a daemon thread; fail the test (rather than hang) after timeout_s."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"{fn} still running after {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _wait_state(job: submitit.Job, states: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        # job.state is cached by submitit's watcher; force an sacct call.
        state = job.get_info(mode="force").get("State", "UNKNOWN")
        if state in states:
            return state
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} state {state}, still not in {states} after {timeout_s} s")
        time.sleep(0.5)


def test_result_on_cpu_and_gpu_partitions(tmp_path: Path) -> None:
    cpu_job = _executor(tmp_path, "cpu").submit(slurm_jobs.add, 2, 3)
    gpu_job = _executor(tmp_path, "gpu", gpus_per_node=1).submit(slurm_jobs.gpu_env)
    assert _bounded(cpu_job.result) == 5
    env = _bounded(gpu_job.result)
    assert env["SLURM_JOB_PARTITION"] == "gpu"
    assert env["CUDA_VISIBLE_DEVICES"] is not None  # set by Slurm from the fake gres devices
    # sacct reads slurmdbd, which can lag the job under load (it once still said PENDING after the result)
    assert _wait_state(cpu_job, {"COMPLETED"}) == "COMPLETED"


def test_exception_surfaces_as_failed_job_error(tmp_path: Path) -> None:
    job = _executor(tmp_path, "cpu").submit(slurm_jobs.fail, "boom from the job")
    with pytest.raises(FailedJobError) as excinfo:
        _bounded(job.result)
    message = str(excinfo.value)
    assert "Traceback" in message
    assert "ValueError: boom from the job" in message
    assert "slurm_jobs.py" in message


def test_scancel_surfaces_as_uncompleted_job_error(tmp_path: Path) -> None:
    job = _executor(tmp_path, "cpu").submit(slurm_jobs.sleep, 600)
    _wait_state(job, {"RUNNING"})
    subprocess.run(["scancel", job.job_id], check=True, timeout=30)
    start = time.monotonic()
    with pytest.raises(UncompletedJobError, match="CANCELLED"):
        _bounded(job.result)
    assert time.monotonic() - start < 300  # noticed long before the 600 s job would have ended


def test_checkpointable_requeue_resumes_with_state(tmp_path: Path) -> None:
    log = tmp_path / "progress.log"
    total = 8
    executor = _executor(tmp_path, "cpu", timeout_min=60)  # long limit: the signal means "preempted"
    job = executor.submit(slurm_jobs.Counter(str(log), total=total, step_s=1.0))

    deadline = time.monotonic() + 180  # a loaded 2-core CI machine: behaviour, not speed, is under test
    while not (log.exists() and "step 3\n" in log.read_text()):
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} made no progress: {log.read_text() if log.exists() else 'no log'}")
        time.sleep(0.2)
    # What Slurm does on preemption: signal the job step with USR2. submitit's handler
    # then calls Counter.checkpoint(), saves the returned DelayedSubmission and runs
    # `scontrol requeue <jobid>` from inside the job.
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True, timeout=30)

    lines = _bounded(job.result)
    checkpoints = [int(line.split()[1]) for line in lines if line.startswith("checkpoint")]
    starts = [line for line in lines if line.startswith("start")]
    steps = [int(line.split()[1]) for line in lines if line.startswith("step")]
    assert len(checkpoints) == 1 and checkpoints[0] >= 3, lines
    assert len(starts) == 2, lines
    assert starts[0].startswith("start 0 ") and "restart 0" in starts[0], lines
    # The second run starts where the checkpoint left off, in the same (requeued) job.
    assert starts[1] == f"start {checkpoints[0]} job {job.job_id} restart 1", lines
    assert steps == list(range(1, total + 1)), lines  # no step lost or redone


def test_a_dead_rank_ends_every_task_of_a_two_node_job(tmp_path: Path) -> None:
    """What lorarl asks srun for a training job of several ranks (lorarl.pipeline.jobs.train_layout: kill-on-bad-exit):
    rank 0 of a 2-node job dies before any collective; rank 1, which would wait 300 s, is ended with it, and the
    job frees both nodes within seconds (without the flag it held them until rank 1 gave up)."""
    from lorarl.pipeline.jobs.slurm import slurm_parameters
    from lorarl.pipeline.jobs.train_layout import job_resources

    _, params = slurm_parameters(job_resources({"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1}, None, "slurm"))
    job = _executor(tmp_path, "multi", **params).submit(slurm_jobs.rank0_dies, 300)
    start = time.monotonic()
    with pytest.raises((FailedJobError, UncompletedJobError)):
        _bounded(job.results, timeout_s=150)
    took = time.monotonic() - start
    assert took < 150, took
    state = _wait_state(job, {"FAILED", "NODE_FAIL", "CANCELLED", "COMPLETED"})
    assert state == "FAILED", state
