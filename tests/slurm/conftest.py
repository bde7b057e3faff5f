"""Every module here needs the Slurm test cluster (tests/slurm/cluster.sh): checked once per
module, before its first test, so a cluster that is not up fails loudly instead of hanging a job."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest


@pytest.fixture(scope="module", autouse=True)
def cluster_is_up() -> None:
    hint = "the Slurm test cluster is not up: run `bash tests/slurm/cluster.sh up` first"
    if shutil.which("sinfo") is None:
        pytest.fail(f"sinfo not on PATH; {hint}")
    for cmd in (["scontrol", "ping"], ["sinfo", "-h", "-o", "%T"], ["sacct", "-n", "-X"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0 or "DOWN" in proc.stdout:
            pytest.fail(f"`{' '.join(cmd)}` failed ({proc.stdout}{proc.stderr.strip()}); {hint}")


def _queued() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return out.stdout.split() if out.returncode == 0 else []


@pytest.fixture(autouse=True)
def no_job_left_behind():
    """After every test, whatever it left in the queue is cancelled and waited for. Killing snakemake does not cancel
    its Slurm jobs: a test that fails mid-run would leave a job holding CPUs of the test nodes until its time limit,
    and every later test would wait behind it (one CI run lost 8 minutes to a 2-node job that way)."""
    yield
    left = _queued()
    if not left:
        return
    subprocess.run(["scancel", *left], capture_output=True, timeout=30)
    deadline = time.monotonic() + 120
    while _queued() and time.monotonic() < deadline:
        time.sleep(0.5)
    if _queued():
        pytest.fail(f"jobs {_queued()} still in the queue 120 s after scancel: the next tests would wait behind them")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """results/models/tiny-test, built once per module, and a perturbed copy as a distillation teacher."""
    from tests.support.slurm import build_slurm_models

    return build_slurm_models(tmp_path_factory)
