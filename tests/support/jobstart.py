"""Helpers of the step-time tests (docs/report.md#step-time): a fresh job's process state, and the check that no
training step holds a job's one-off start-up."""

from __future__ import annotations

import statistics

import pandas as pd


def new_job(monkeypatch) -> None:
    """What a fresh job process starts with: no grading workers (one, when started: its start is what a first step
    must not pay), no start-up recorded (lorarl.jobclock)."""
    from lorarl import jobclock
    from lorarl.grading import pool

    pool.shutdown_pool()
    monkeypatch.setenv("LORARL_GRADER_WORKERS", "1")
    monkeypatch.setattr(jobclock, "_startup", {})


def startup_steps(rows: pd.DataFrame) -> list[int]:
    """The steps whose row carries a job's start-up (`time/startup_s`): each job's first step of the cell."""
    return [int(s) for s in rows.loc[rows["time/startup_s"].notna(), "step"]] if "time/startup_s" in rows else []


def assert_no_one_off_step(rows: pd.DataFrame, first_steps: list[int]) -> None:
    """Each job's first step costs no more than twice the cell's median step (its share of the summed step time is
    no larger than a later step's by more than 2x): the job's start-up is in `time/startup_s`, not there."""
    times = rows.set_index("step")["step_time_s"]
    median = statistics.median(times.drop(index=first_steps))
    for step in first_steps:
        assert times[step] <= 2 * median, (step, times.to_dict(), rows["time/startup_s"].dropna().to_dict())
