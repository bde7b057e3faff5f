"""lorarl.ledger: a job's clock by phase, its allocation, and the one record per attempt its entry writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lorarl import jobclock, ledger


def test_phases_startup_other_and_idle_add_up_to_the_wall_time(monkeypatch):
    monkeypatch.setattr(jobclock, "_printed", set())
    ledger.begin(in_process=True)
    ledger.spent("wait", 0.05)  # before the first work: a wait, not start-up
    time.sleep(0.1)
    jobclock.first_work("unit step")
    ledger.step_begin()
    ledger.spent("generation", 0.02)
    ledger.spent("reward", 0.01)
    time.sleep(0.1)
    ledger.close_step(0.1)  # what the step's phases did not take is its update
    with ledger.phase("checkpoint"):
        time.sleep(0.02)
    time.sleep(0.05)
    ledger.run_ended()
    time.sleep(0.03)  # after the stage's run: the executor's, idle
    rec = ledger.record("train", study="s", cell="c", outcome="completed", threads=3)
    ph = rec["phases_s"]
    assert ph["update"] == pytest.approx(0.07, abs=1e-6) and ph["generation"] == 0.02 and ph["wait"] == 0.05
    assert ph["checkpoint"] >= 0.02 and rec["steps"] == 1
    assert 0.05 <= ph["startup"] <= 0.1 + 0.05  # 0.1 s before the first work, less the 0.05 s wait
    assert ph["other"] >= 0.05 - 0.03  # after the first work, what no phase timer took (here: sleeps)
    assert rec["idle_s"] >= 0.025 and sum(ph.values()) + rec["idle_s"] == pytest.approx(rec["wall_s"], abs=2e-3)
    assert rec["devices"]["cpus"] == 3 and rec["devices"]["cpu_source"] == "threads"
    assert 0 <= rec["cpu_idle_share"] <= 1


def test_a_stage_without_finer_timers_books_its_work_under_its_registered_phase(monkeypatch):
    monkeypatch.setattr(jobclock, "_printed", set())
    ledger.begin(in_process=True)
    jobclock.first_work("unit diagnostic")
    time.sleep(0.05)
    ledger.run_ended()
    from lorarl.pipeline.doctor import stage as doctor_stage  # registers the doctor's stage, as its job does
    from lorarl.pipeline.jobs.stages import STAGES

    rec = ledger.record("diagnose", study="s", cell="c", outcome="completed", threads=1, work=STAGES["diagnose"].work)
    assert rec["phases_s"]["diagnostics"] >= 0.05 and "other" not in rec["phases_s"]
    assert {s.work for s in STAGES.values()} <= set(ledger.PHASES) and STAGES["base"].work == "update"
    assert STAGES[doctor_stage.NAME].work == "other"  # the registry's fact, also for a stage registered elsewhere
    with pytest.raises(ValueError, match="unknown ledger phase 'diag' for the work of stage 'diagnose'; allowed: "
                                         "startup, load"):
        ledger.record("diagnose", study="s", cell="c", outcome="completed", work="diag")


def test_unknown_phase_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown ledger phase 'gen'; allowed: startup, load, generation, reward"):
        ledger.spent("gen", 1.0)


def test_allocation_from_slurm_cuda_threads_and_affinity():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "4", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_NUM_NODES": "2",
             "CUDA_VISIBLE_DEVICES": "0"}
    assert ledger.allocation(1, slurm) == {"gpus": 4, "cpus": 8, "gpu_source": "slurm", "cpu_source": "slurm"}
    cuda = ledger.allocation(2, {"CUDA_VISIBLE_DEVICES": "1,3"})
    assert (cuda["gpus"], cuda["gpu_source"], cuda["cpus"], cuda["cpu_source"]) == (2, "CUDA_VISIBLE_DEVICES", 2,
                                                                                     "threads")
    import os

    assert ledger.allocation(None, {"CUDA_VISIBLE_DEVICES": ""})["cpus"] == len(os.sched_getaffinity(0))


def test_pack_tokens_and_the_record_file(tmp_path):
    ledger.begin(in_process=True)
    ledger.count_tokens("a", 30)
    ledger.count_tokens("b", 10)
    ledger.count_tokens("a", 30)
    rec = ledger.record("pack", study="s", cell="a,b", outcome="completed", threads=1)
    assert rec["members"] == {"a": 60.0, "b": 10.0} and rec["member_steps"] == {"a": 2, "b": 1}
    path = ledger.write(ledger.cost_dir(tmp_path / "s" / ".packs" / "p1" / "provenance" / "pack.json"), rec)
    assert path.parent == tmp_path / "s" / ".packs" / "p1" / "cost" and json.loads(path.read_text()) == rec
    assert ledger.cost_dir(tmp_path / "models" / ".logs" / "m" / "provenance.json") == \
        tmp_path / "models" / ".logs" / "m" / "cost"


@pytest.mark.parametrize("fails", [False, True])
def test_stage_job_writes_one_record_per_attempt_also_when_it_fails(tmp_path, monkeypatch, fails):
    from lorarl.pipeline.jobs import launch

    def fake_stage(stage, study_path, cell_id, results_dir, threads, params=None):
        jobclock.first_work(f"unit {fails}")
        ledger.spent("generation", 0.01)
        if fails:
            raise RuntimeError("boom")
        return {"ok": 1}

    monkeypatch.setattr(jobclock, "_printed", set())
    monkeypatch.setattr(launch, "run_stage", fake_stage)
    monkeypatch.setattr(launch.provenance, "gpu_type", lambda: "cpu")
    prov = tmp_path / "res" / "st" / "c1" / "provenance" / "evaluate-synthetic@10.json"
    job = launch.StageJob("evaluate", "study.yaml", "c1", str(tmp_path / "res"), 2, str(prov), None, "st")
    if fails:
        with pytest.raises(RuntimeError):
            job()
    else:
        assert job() == {"ok": 1}
    [path] = (tmp_path / "res" / "st" / "c1" / "cost").glob("*.json")
    rec = json.loads(path.read_text())
    assert path.name.startswith("evaluate-synthetic@10-local-0-") and rec["key"] == "evaluate-synthetic@10"
    assert (rec["study"], rec["cell"], rec["stage"]) == ("st", "c1", "evaluate")
    assert rec["outcome"] == ("failed: RuntimeError: boom" if fails else "completed")
    assert rec["phases_s"]["generation"] == 0.01 and rec["wall_s"] < 30  # in-process: from the entry, not the process


def test_on_slurm_the_wall_time_starts_with_the_allocation_and_the_wait_for_the_process_is_idle(tmp_path, monkeypatch):
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 6))
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\necho 'JobId=$3 JobState=RUNNING StartTime={started} EndTime=Unknown'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    assert ledger.slurm_start() == pytest.approx(time.time() - 6, abs=1.5)
    ledger.begin(False, 2.0)  # the job's process started 2 s ago
    ledger.first_work()
    rec = ledger.record("evaluate", study="s", cell="c", outcome="completed", threads=1)
    assert rec["started_by"] == "slurm" and 5 <= rec["wall_s"] <= 8
    assert rec["phases_s"]["startup"] == pytest.approx(2.0, abs=0.5) and rec["idle_s"] >= 3  # before the process
    monkeypatch.setenv("SLURM_JOB_ID", "")
    ledger.begin(False, 2.0)
    assert ledger.record("evaluate", study="s", cell="c", outcome="x")["started_by"] == "process"


def test_a_job_in_its_own_process_counts_its_exit(tmp_path):
    """The record is written when the stage ends and again at the process's exit, with the time in between."""
    import subprocess
    import sys

    code = ("import time; from lorarl import ledger\n"
            f"with ledger.job({str(tmp_path)!r}, 'diagnose', in_process=False, process_age_s=0.0, study='s', cell='c',\n"
            "                work='diagnostics'):  # the diagnose stage's registered phase (its launcher passes it)\n"
            "    ledger.first_work(); time.sleep(0.2)\n"
            "time.sleep(0.5)  # after the stage: the process is still the job's\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**__import__("os").environ,
                                                                  "PYTHONPATH": str(Path(__file__).parents[1])})
    [path] = tmp_path.glob("diagnose-*.json")
    rec = json.loads(path.read_text())
    assert rec["exit_s"] >= 0.5 and rec["idle_s"] >= 0.5 and rec["wall_s"] >= 0.7
    assert rec["phases_s"]["diagnostics"] >= 0.2 and rec["outcome"] == "completed"
    assert sum(rec["phases_s"].values()) + rec["idle_s"] == pytest.approx(rec["wall_s"], abs=0.01)
