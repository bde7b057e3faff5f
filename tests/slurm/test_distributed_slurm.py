"""One cell on two ranks through the user's command, `snakemake --profile slurm`: a Slurm job of 2 tasks
(submitit's ranks, torch.distributed over gloo on the test node's CPUs), every stage after it as usual."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.slurm.test_pipeline_slurm import SLURM, mlflow_client, models, snakemake, study, workdir_for  # noqa: F401

pytestmark = pytest.mark.slurm


def test_two_task_training_job_runs_a_cell_end_to_end(models, tmp_path: Path):  # noqa: F811
    spec = study("dd", {"seed": {"field": "seed", "prefix": "s", "values": [3]}}, checkpoint_every=0)
    spec["defaults"]["adapter"]["init"] = "pissa"  # an SVD init: each module's SVD computed by one rank only
    wd = workdir_for(tmp_path, models, spec)
    # the layout is the profile's (runtime): 2 tasks on one node of the cpu partition, one CPU each
    slurm = {**SLURM, "train": {"partition": "cpu", "tasks_per_node": 2, "cpus_per_task": 1, "mem_gb": 4,
                                "timeout_min": 30}}
    proc = snakemake(wd, slurm=slurm)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    cell = wd / "results" / "dd" / "s3"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["steps"] == 3 and (cell / "eval" / "synthetic.json").exists()
    job = json.loads((cell / "provenance" / "train.json").read_text())["submissions"][0]["job_id"]
    acct = subprocess.run(["sacct", "-j", job, "-n", "-P", "--format=JobID,NTasks,State"], capture_output=True,
                          text=True, timeout=60).stdout
    steps = {line.split("|")[0]: line.split("|")[1:] for line in acct.splitlines() if line}
    assert steps.get(f"{job}.0") == ["2", "COMPLETED"], acct  # srun's step: the two ranks
    logs = cell / "logs" / "train"
    assert (logs / f"{job}_0_log.out").exists() and (logs / f"{job}_1_log.out").exists(), sorted(logs.iterdir())
    svd = [re.findall(r"rank (\d): SVD cache: (\d+) computed, (\d+) read", (logs / f"{job}_{r}_log.out").read_text())
           for r in (0, 1)]
    assert [len(x) for x in svd] == [1, 1], svd  # one line per rank
    (r0, c0, h0), (r1, c1, h1) = (tuple(map(int, x[0])) for x in svd)
    modules = c0 + h0
    assert (r0, r1) == (0, 1) and modules > 0 and c1 + h1 == modules  # every rank inits every module
    assert c0 + c1 == modules, svd  # ... from SVDs computed once: whichever rank locked a module first
    client = mlflow_client(wd)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["train.ranks"] == "2" and run.info.status == "FINISHED"
    for key in ("loss", "reward", "grad_norm"):  # rank 0 alone logs: every step once
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [1, 2, 3], key
