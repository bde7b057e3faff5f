"""Step time without one-off costs: a job starts its grading workers beside the model load
(lorarl.train.prepare.start_grading) and waits for them before its first step (CellRun.ready); that wait (and an
engine's start) is the job's start-up (lorarl.jobclock), written as `time/startup_s` on the job's first row and
summed in the summary's `startup_s`, never in a step's time. So step 1 costs what a later step costs, and a cell
resumed in a second job (which starts its workers again) has the step times of an uninterrupted one."""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest
import yaml

from lorarl import jobclock
from lorarl.grading import pool


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"))


def cell(tmp_path, tiny):
    from lorarl.study import cell_table, load_study

    doc = {"name": "st", "defaults": {
        "model": str(tiny), "task": {"name": "synthetic", "seed": 7, "n_train": 12, "n_eval": 4, "max_value": 9},
        "adapter": {"method": "lora", "rank": 2, "alpha": 4, "dropout": 0.0},
        "train": {"steps": 5, "prompts_per_step": 2, "generations": 2, "max_completion_length": 8, "lr": 1e-2,
                  "checkpoint_every": 0, "kl_monitor_every": 0}}}
    p = tmp_path / "st.yaml"
    p.write_text(yaml.safe_dump(doc))
    return cell_table(load_study(str(p))).cells[0]


def new_job(monkeypatch) -> None:
    """What a fresh job process starts with: no grading workers, no start-up recorded."""
    pool.shutdown_pool()
    monkeypatch.setattr(jobclock, "_startup", {})


def rows_and_summary(results, c):
    d = results / "st" / c.id
    return pd.read_csv(d / "metrics.csv"), json.loads((d / "summary.json").read_text())


def assert_no_one_off_step(rows: pd.DataFrame, first_steps: list[int]) -> None:
    """Each job's first step costs no more than twice the cell's median step (its share of the summed step time
    is no larger than a later step's by more than 2x): the workers' start is in `time/startup_s`, not there."""
    times = rows.set_index("step")["step_time_s"]
    median = statistics.median(times.drop(index=first_steps))
    for step in first_steps:
        assert times[step] <= 2 * median, (step, times.to_dict(), rows["time/startup_s"].dropna().to_dict())


def test_each_job_starts_its_grading_workers_before_its_first_step_and_outside_its_time(tmp_path, tiny, monkeypatch):
    from lorarl.train.main import train_cell

    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    monkeypatch.setenv("LORARL_GRADER_WORKERS", "1")  # one worker: its start is what the first step must not pay
    c, res = cell(tmp_path, tiny), tmp_path / "r"
    new_job(monkeypatch)
    assert train_cell("st", c, res, threads=1, stop_at=2)["state"] == "paused"
    assert "grading pool" in jobclock.startup_s()
    assert pool.wait_started() == 0.0  # started once per job: a ready pool costs nothing more
    new_job(monkeypatch)  # resumed in a second job, which starts its workers again
    train_cell("st", c, res, threads=1)
    rows, summary = rows_and_summary(res, c)
    startup = rows.set_index("step")["time/startup_s"].dropna()
    assert list(startup.index) == [1, 3] and (startup > 0).all()  # each job's start-up, on its own first row
    assert summary["startup_s"] == pytest.approx(float(startup.sum()), abs=1e-3) and summary["steps"] == 5
    assert_no_one_off_step(rows, [1, 3])  # the resumed cell's step time is an uninterrupted one's


def test_an_engine_built_for_a_pack_is_the_jobs_start_up(monkeypatch):
    """A pack's vLLM engine is built before its first step; its construction is recorded as the job's start-up."""
    import time
    from types import SimpleNamespace

    from lorarl.pack import vllm_rollouts

    def slow_llm(model, **kw):
        time.sleep(0.05)
        return SimpleNamespace(model=model)

    monkeypatch.setattr(jobclock, "_startup", {})
    monkeypatch.setattr(vllm_rollouts, "_ENGINE", {})
    api = SimpleNamespace(LLM=slow_llm)
    llm = vllm_rollouts.pack_engine(api, "m", {"max_loras": 1, "max_lora_rank": 8})
    first = jobclock.startup_s()
    assert llm.model == "m" and first["engine"] >= 0.05
    assert vllm_rollouts.pack_engine(api, "m", {"max_loras": 1, "max_lora_rank": 8}) is llm  # kept: no second start
    assert jobclock.startup_s() == first
