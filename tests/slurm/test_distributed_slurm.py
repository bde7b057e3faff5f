"""One cell on two ranks through the user's command, `snakemake --profile slurm`: a Slurm job of 2 nodes, one
task each (submitit's ranks, torch.distributed over gloo; the test cluster's second node is a slurmd in its
own UTS namespace on the same machine, tests/slurm/cluster.sh), preempted once (Slurm's USR2) and requeued,
every stage after it as usual."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.slurm import REPO, SLURM, env, mlflow_client, snakemake_cmd, study, wait_progress, workdir_for

pytestmark = pytest.mark.slurm


def test_a_preempted_two_node_job_runs_a_cell_end_to_end_and_resumes_every_rank_into_one_run(models, tmp_path: Path):
    """Slurm's USR2 (preemption) to a training job of 2 nodes: rank 0 checkpoints (every rank writes its part),
    every rank stops, submitit requeues the one job; its 2 tasks, one per node, resume from that checkpoint into
    the same MLflow run and every step is logged once. Each node has a local rank 0: what is written once is
    written by global rank 0. The cell's PiSSA init computes each module's SVD on one rank only."""
    import pandas as pd

    steps = 12
    spec = study("dd", {"seed": {"field": "seed", "prefix": "s", "values": [3]}}, steps=steps, checkpoint_every=4)
    spec["defaults"]["adapter"]["init"] = "pissa"  # an SVD init: each module's SVD computed by one rank only
    wd = workdir_for(tmp_path, models, spec)
    # the layout is the profile's (runtime): 2 nodes of the multi partition, one task and one CPU each
    slurm = {**SLURM, "train": {"partition": "multi", "nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1,
                                "mem_gb": 4, "timeout_min": 30, "signal_delay_s": 30}}
    progress = wd / "results" / "dd" / ".checkpoints" / "s3" / "progress.json"

    def wait(min_step: int, not_pid: int | None) -> dict:
        return wait_progress([progress], min_step, not_pid, proc)

    log = (tmp_path / "snakemake.log").open("w")
    proc = subprocess.Popen(snakemake_cmd(wd, slurm), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=env())
    try:
        p = wait(5, None)
        subprocess.run(["scancel", "--signal=USR2", p["job_id"]], check=True, timeout=30)  # what preemption does
        q = wait(p["step"] + 2, p["pid"])  # requeued: the same job, new processes, training on
        assert q["job_id"] == p["job_id"]
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert rc == 0, (tmp_path / "snakemake.log").read_text()[-5000:]
    cell = wd / "results" / "dd" / "s3"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["steps"] == steps and len(summary["resumed_from_steps"]) == 1, summary
    assert (cell / "eval" / "synthetic.json").exists()
    assert pd.read_csv(cell / "metrics.csv")["step"].tolist() == list(range(1, steps + 1))
    job = p["job_id"]
    acct = subprocess.run(["sacct", "-j", job, "-n", "-P", "--format=JobID,NTasks,NNodes,State"],
                          capture_output=True, text=True, timeout=60).stdout
    steps_of = {line.split("|")[0]: line.split("|")[1:] for line in acct.splitlines() if line}
    assert steps_of.get(f"{job}.0") == ["2", "2", "COMPLETED"], acct  # srun's step: the two ranks on two nodes
    client = mlflow_client(wd)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["train.ranks"] == "2" and run.info.status == "FINISHED"
    for key in ("loss", "reward", "grad_norm"):  # rank 0 alone logs: one run, every step once across the requeue
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == list(range(1, steps + 1))
    logs = cell / "logs" / "train"
    first, second = ((logs / f"{job}_{r}_log.out").read_text() for r in (0, 1))
    hosts = [re.findall(r"JobEnvironment\(job_id=\S+, hostname=([^,]+), local_rank=0\(1\), node=(\d)\(2\), "
                        r"global_rank=(\d)\(2\)\)", text) for text in (first, second)]
    assert [len(h) for h in hosts] == [2, 2], hosts  # each task: local rank 0 of its node, both starts
    assert {h[0][1:] for h in hosts} == {("0", "0"), ("1", "1")} and hosts[0][0][0] != hosts[1][0][0], hosts
    assert first.count("Starting with JobEnvironment") == second.count("Starting with JobEnvironment") == 2
    assert f"Requeued job {job}" in first and "Not checkpointing nor requeuing since I am a slave" in second
    assert "[lorarl] rank 1: rank 0 stopped for a preemption; checkpoint saved, exiting" in second
    assert "[lorarl] resuming from" in first and f"into MLflow run {run.info.run_id}" in first
    svd = [re.findall(r"rank (\d): SVD cache: (\d+) computed, (\d+) read", text) for text in (first, second)]
    assert [len(x) for x in svd] == [2, 2], svd  # one line per rank and start
    (r0, c0, h0), (r1, c1, h1) = (tuple(map(int, x[0])) for x in svd)  # the first start
    modules = c0 + h0
    assert (r0, r1) == (0, 1) and modules > 0 and c1 + h1 == modules  # every rank inits every module
    assert c0 + c1 == modules, svd  # ... from SVDs computed once: whichever rank locked a module first
    assert all(x[1][1] == "0" for x in svd), svd  # after the requeue: every SVD read from the cache
