"""Helpers of the step-time tests (docs/report.md#step-time): a fresh job's process state, and the check that no
training step holds a job's one-off start-up."""

from __future__ import annotations

import statistics
import time

import pandas as pd

SLOW_START_S = 1.0  # each job's wait for its grading workers, made this much longer (slow_start)


def new_job(monkeypatch) -> None:
    """What a fresh job process starts with: no grading workers (one, when started: its start is what a first step
    must not pay), no start-up recorded (lorarl.jobclock)."""
    from lorarl import jobclock
    from lorarl.grading import pool

    pool.shutdown_pool()
    monkeypatch.setenv("LORARL_GRADER_WORKERS", "1")
    monkeypatch.setattr(jobclock, "_startup", {})


def slow_start(monkeypatch) -> None:
    """Each job's first wait for its grading workers (lorarl.grading.pool.wait_started, before its first step; a job
    is new_job's) takes SLOW_START_S more, recorded as its start-up: a one-off that a step charged with it could not
    hide in a loaded machine's step-time noise (a tiny model's step is ~50 ms; on 2 busy cores one took 0.24 s)."""
    from lorarl import jobclock
    from lorarl.grading import pool

    real = pool.wait_started

    def slow(*args, **kwargs) -> float:
        if "grading pool" in jobclock.startup_s():  # this job waited already: a ready pool costs nothing more
            return real(*args, **kwargs)
        time.sleep(SLOW_START_S)
        jobclock.startup("grading pool", SLOW_START_S)
        return SLOW_START_S + real(*args, **kwargs)

    monkeypatch.setattr(pool, "wait_started", slow)


def startup_steps(rows: pd.DataFrame) -> list[int]:
    """The steps whose row carries a job's start-up (`time/startup_s`): each job's first step of the cell."""
    return [int(s) for s in rows.loc[rows["time/startup_s"].notna(), "step"]] if "time/startup_s" in rows else []


def assert_no_one_off_step(rows: pd.DataFrame, first_steps: list[int]) -> None:
    """Each job's first step costs no more than the cell's median step plus the larger of that median and half of
    SLOW_START_S: the job's start-up (at least SLOW_START_S under slow_start) is in `time/startup_s`, not there.
    A step charged with it would exceed the median by SLOW_START_S; a loaded machine's noise (a 0.24 s first step
    against a 0.05 s median, seen in CI) stays under the bound."""
    times = rows.set_index("step")["step_time_s"]
    median = statistics.median(times.drop(index=first_steps))
    startup = rows.set_index("step")["time/startup_s"]
    for step in first_steps:
        assert startup[step] >= SLOW_START_S, (step, startup.dropna().to_dict())  # the start-up was the job's
        assert times[step] <= median + max(median, SLOW_START_S / 2), (step, times.to_dict(), startup.dropna().to_dict())
