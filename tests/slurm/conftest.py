"""Every module here needs the Slurm test cluster (tests/slurm/cluster.sh): checked once per
module, before its first test, so a cluster that is not up fails loudly instead of hanging a job."""

from __future__ import annotations

import shutil
import subprocess

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
