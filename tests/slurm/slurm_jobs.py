"""Functions and callables submitted by test_cluster.py.

They live in their own module (not the test module) so that the job's Python can
import them by name: submitit pickles them by reference, and the tests put this
directory on the job's PYTHONPATH.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import submitit


def add(a: int, b: int) -> int:
    return a + b


def gpu_env() -> dict[str, str | None]:
    return {
        "host": socket.gethostname(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "SLURM_JOB_PARTITION": os.environ.get("SLURM_JOB_PARTITION"),
    }


def fail(message: str) -> None:
    raise ValueError(message)


def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "woke up"


class Counter(submitit.helpers.Checkpointable):
    """Counts to `total`, one step per `step_s`, appending progress to `log`.

    `start` is the state carried across requeues: checkpoint() (called by
    submitit's signal handler on preemption) resubmits itself with `start`
    set to the last finished step.
    """

    def __init__(self, log: str, total: int, step_s: float) -> None:
        self.log, self.total, self.step_s = log, total, step_s
        self.start = 0
        self.done = 0

    def __call__(self) -> list[str]:
        job_id = os.environ.get("SLURM_JOB_ID", "?")
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        with Path(self.log).open("a") as f:
            f.write(f"start {self.start} job {job_id} restart {restarts}\n")
        for step in range(self.start, self.total):
            time.sleep(self.step_s)
            self.done = step + 1
            with Path(self.log).open("a") as f:
                f.write(f"step {self.done}\n")
        return Path(self.log).read_text().splitlines()

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        with Path(self.log).open("a") as f:
            f.write(f"checkpoint {self.done}\n")
        resumed = Counter(self.log, self.total, self.step_s)
        resumed.start = self.done
        return submitit.helpers.DelayedSubmission(resumed)


def rank0_dies(sleep_s: float) -> str:
    """Task 0 of a job of several dies at once (no result, no cleanup: what a crash or an OOM kill does); the
    others wait ``sleep_s``, as a rank blocked in a rendezvous or a collective would."""
    if submitit.JobEnvironment().global_rank == 0:
        time.sleep(1)
        os._exit(3)
    time.sleep(sleep_s)
    return "outlived rank 0"
