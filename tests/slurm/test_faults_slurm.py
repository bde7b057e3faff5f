"""The submit host dies mid-study on the real Slurm test cluster (issue 16).

Snakemake and every `lorarl launch` are SIGKILLed while the training jobs run on Slurm. After
`snakemake --unlock`, a restarted `snakemake --profile slurm all` finds each cell's job still in
flight (by its job name / recorded id, `squeue`) and waits on it: one Slurm job per cell and stage,
none failed on another job's lock, and the study completes. The one window docs/slurm.md names (a job that
ends before the restarted launcher looks has its outputs removed by Snakemake as incomplete, and the stage
runs again) is allowed when it happens, as a second job that starts after the first ended: never two at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lorarl.pipeline.drills import faults
from tests.support.slurm import REPO, env, snakemake, snakemake_cmd, study, workdir_for

pytestmark = pytest.mark.slurm


def _train_jobs(name: str, since: str) -> list[tuple[str, str, str, str]]:
    """(job id, state, start, end) of the jobs of this name since `since`, in submission order."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", since, "--name", name, "-o", "JobID,State,Start,End"],
                         capture_output=True, text=True, timeout=60).stdout
    return [tuple(line.split("|")[:4]) for line in out.splitlines() if line.strip()]


def test_submit_host_dies_while_jobs_run(models, tmp_path: Path):
    since = time.strftime("%Y-%m-%dT%H:%M:%S")  # jobs of this test only (the cluster keeps older ones)
    wd = workdir_for(tmp_path, models, study("hostdie", {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}},
                                             steps=6))
    proc = subprocess.Popen(snakemake_cmd(wd), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env())
    names = [f"lorarl-train-hostdie-s{i}" for i in (0, 1)]
    deadline, running = time.time() + 600, []
    while time.time() < deadline and not running:  # a training job running on the cluster
        q = subprocess.run(["squeue", "-h", "-o", "%j|%T"], capture_output=True, text=True).stdout
        running = [n for n in names if f"{n}|RUNNING" in q]
        time.sleep(0.5)
    if not running:
        proc.kill()
        pytest.fail("no training job ever ran")
    proc.send_signal(signal.SIGKILL)  # the submit host dies: Snakemake and every launcher, no cleanup
    proc.wait()
    for pid, stage in faults._procs(wd):
        if stage in ("launcher", "aggregate"):
            os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    q = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout.split()
    assert [q.count(n) for n in running] == [1] * len(running)  # still in flight, once

    unlock = subprocess.run(snakemake_cmd(wd) + ["--unlock"], cwd=REPO, capture_output=True, text=True, env=env())
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    restart = time.strftime("%Y-%m-%dT%H:%M:%S")
    again = snakemake(wd)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-6000:]
    for i, n in enumerate(names):
        jobs = _train_jobs(n, since)
        assert jobs and all(j[1] == "COMPLETED" for j in jobs), jobs
        cell = wd / "results" / "hostdie" / f"s{i}"
        log = (cell / "logs" / "train.log").read_text()
        subs = json.loads((cell / "provenance" / "train.json").read_text())["submissions"]
        if len(jobs) == 1:  # adopted (or submitted once)
            if n in running:  # in flight when the host died: the restarted launcher waited on it
                assert f"job {jobs[0][0]} of an earlier launcher is still" in log, log[-2000:]
            assert len(subs) == 1
        else:  # the window docs/slurm.md names: the job ended before the restarted Snakemake began, which
            # removed its outputs as incomplete; the stage ran again, never while the first job was in flight
            assert len(jobs) == 2 and jobs[0][3] <= jobs[1][2], (jobs, restart)
            assert "of an earlier launcher is still" not in log and len(subs) == 2, log[-2000:]
        assert json.loads((cell / "summary.json").read_text())["steps"] == 6
        errs = "".join(p.read_text() for p in (cell / "logs" / "train").glob("*.err"))
        assert "being trained by another process" not in errs
