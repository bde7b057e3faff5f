"""`snakemake --profile slurm` end to end against the real Slurm test cluster.

Bring the cluster up first (CI does):  bash tests/slurm/cluster.sh up
These tests fail loudly, not skip, when it is not up.

Snakemake runs from the repo root with `--profile slurm` (the exact user command; results go to a
temporary directory through --directory/--configfile). The profile's per-stage resources are sized for
real GPU nodes, so the tests override the `slurm:` config key with what the one test node can give
(1 CPU, 2 GB, a fake GPU for training); everything else (launcher: slurm included) comes from
profiles/slurm.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.slurm import REPO, env, mlflow_client, snakemake, snakemake_cmd, study, wait_progress, workdir_for

pytestmark = pytest.mark.slurm

CORE = ["reward", "loss", "grad_norm", "entropy", "num_tokens"]


def status(workdir: Path) -> dict[str, dict]:
    out = subprocess.run([sys.executable, "-m", "lorarl.cli", "status", str(workdir / "study.yaml"), "--results",
                          str(workdir / "results"), "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {row["cell"]: row for row in json.loads(out.stdout)}


def test_two_cell_study_end_to_end(models, tmp_path: Path):
    wd = workdir_for(tmp_path, models, study("sl2", {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}))
    proc = snakemake(wd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Using profiles slurm" in proc.stderr
    res = wd / "results" / "sl2"
    client = mlflow_client(wd)
    job_ids = set()
    for cell in ("s0", "s1"):
        d = res / cell
        for f in ("summary.json", "metrics.csv", "adapter/adapter_config.json", "eval/synthetic.json"):
            assert (d / f).exists(), f
        assert not (res / ".checkpoints" / cell).exists()  # removed once the cell completed
        prov = json.loads((d / "provenance" / "train.json").read_text())
        (sub,) = prov["submissions"]
        assert sub["executor"] == "slurm" and sub["slurm"]["partition"] == "gpu" and sub["git"]["sha"]
        assert (d / "provenance" / sub["pip_freeze"]).read_text().count("==") > 20
        (attempt,) = sub["attempts"]
        assert attempt["job_id"] == sub["job_id"] and attempt["partition"] == "gpu"
        assert attempt["cuda_visible_devices"] and attempt["gpu"] == "cpu" and attempt["outcome"] == "completed"
        job_ids.add(sub["job_id"])
        # the job's own stdout/stderr under the cell's logs/, the Snakemake log beside them
        assert (d / "logs" / "train" / f"{sub['job_id']}_0_log.err").exists()
        assert f"submitted job {sub['job_id']} (slurm)" in (d / "logs" / "train.log").read_text()
        summary = json.loads((d / "summary.json").read_text())
        run = client.get_run(summary["mlflow_run_id"])
        assert run.data.tags["lorarl.job_ids"] == sub["job_id"]
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2, 3]
    assert len(job_ids) == 2
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,Partition"],
                           capture_output=True, text=True).stdout
    assert sacct.count("COMPLETED|gpu") == 2, sacct
    rows = status(wd)
    assert rows["s0"]["train"]["state"] == rows["s1"]["train"]["state"] == "done"
    assert rows["s0"]["evaluate"]["state"] == "done"
    assert (res / "tables" / "summary.md").exists()
    # the cost ledger (lorarl.ledger) against the scheduler: every Slurm job left one record, and the study's
    # core-seconds (wall x allocated CPUs, by the jobs themselves) equal sacct's elapsed x AllocCPUS within 10%
    from lorarl.jobids import job_ids as prov_ids
    from lorarl.report.cost import read_records

    recs = [r for r in read_records(wd / "results", "sl2") if r["stage"] != "aggregate"]  # the aggregate runs locally
    submitted = {j for p in res.glob("*/provenance/*.json") for j in prov_ids(p)}
    assert {r["job_id"] for r in recs} == submitted and len(recs) == len(submitted), (recs, submitted)
    assert all(r["devices"]["gpus"] == 1 for r in recs if r["stage"] == "train"), recs  # the fake GPU Slurm gave
    assert all(r["devices"]["gpus"] == 0 and r["started_by"] == "slurm" for r in recs if r["stage"] == "diagnose"), recs
    acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(submitted), "-o", "JobID,ElapsedRaw,AllocCPUS"],
                          capture_output=True, text=True).stdout
    sacct_s = sum(int(e) * int(c) for line in acct.split() for _, e, c in [line.split("|")])
    ledger_s = sum(r["wall_s"] * r["devices"]["cpus"] for r in recs)  # with each job's scheduler tail (sacct's)
    in_job_s = sum((r["wall_s"] - r["phases_s"].get("scheduler", 0.0)) * r["devices"]["cpus"] for r in recs)
    assert abs(ledger_s - sacct_s) <= 0.1 * sacct_s, (ledger_s, sacct_s, acct)
    assert 0.75 * sacct_s <= in_job_s <= 1.02 * sacct_s, (in_job_s, sacct_s, acct)  # the jobs' own clocks alone
    print(f"[cost ledger] {len(recs)} jobs: ledger {ledger_s:.1f} core-s ({in_job_s:.1f} by the jobs' clocks), "
          f"sacct {sacct_s} core-s")

    again = snakemake(wd)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_requeue_and_kill_resume_into_one_continuous_run(models, tmp_path: Path):
    """USR2 (submitit requeue), `scontrol requeue` (external) and a plain `scancel` + Snakemake rerun,
    all in one training: one MLflow run, every step once, the adapter of an uninterrupted run."""
    import pandas as pd
    import torch
    from mlflow.entities import ViewType
    from safetensors.torch import load_file

    steps = 32  # the third interruption comes near step 14 (waits of 4, 4 and 2 steps): room to finish after it
    spec = study("rq", {"seed": {"field": "seed", "prefix": "s", "values": [5]}}, steps=steps, checkpoint_every=4)
    spec["defaults"]["reward"] = {"regime": "distillation", "teacher": str(models[1])}
    wd = workdir_for(tmp_path / "slurm", models, spec)
    ckpts = wd / "results" / "rq" / ".checkpoints" / "s5"
    progress = ckpts / "progress.json"
    log = (wd / "snakemake.log").open("w")
    # each step lasts at least 0.4 s (test hook): on a quiet machine the tiny cell trains its 32 steps in 4 s, before
    # the signals below could reach it (the job then finished, and its requeue found the cell trained)
    slow = env(LORARL_FAULT="step_delay_ms:400")
    proc = subprocess.Popen(snakemake_cmd(wd), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=slow)
    try:
        p = wait_progress([progress], 4, None, proc)
        job = p["job_id"]
        row = status(wd)["s5"]["train"]
        assert row["state"] == "running" and row["job"] == job and row["step"].endswith(f"/{steps}"), row
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)  # what preemption does
        p = wait_progress([progress], p["step"] + 4, p["pid"], proc)  # requeued, resumed, trained on
        assert p["job_id"] == job  # the same (requeued) job
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)  # SIGTERM, no checkpoint()
        p = wait_progress([progress], p["step"] + 2, p["pid"], proc)
        subprocess.run(["scancel", job], check=True, timeout=30)  # killed outright
        assert proc.wait(timeout=300) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    cell = wd / "results" / "rq" / "s5"
    train_log = (cell / "logs" / "train.log").read_text()
    lines = train_log.splitlines()  # the last FAILED line is the job's; then, at most, the workflow's retries
    fails = [i for i, line in enumerate(lines) if "FAILED: job" in line]  # refused (not out of memory)
    assert fails and f"FAILED: job {job} state CANCELLED" in lines[fails[-1]], train_log[-2000:]
    after = [line for line in lines[fails[-1] + 1:] if line.startswith("[lorarl] train")]
    assert all("only out-of-memory failures are retried" in line for line in after), train_log[-2000:]
    row = status(wd)["s5"]["train"]
    assert row["state"] == "failed" and "CANCELLED" in row["detail"] and "resumes from step" in row["detail"], row
    assert not (cell / "summary.json").exists()

    rerun = snakemake(wd)  # the cell resumes from its checkpoint in a new job
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-6000:]
    summary = json.loads((cell / "summary.json").read_text())
    assert len(summary["resumed_from_steps"]) == 3, summary["resumed_from_steps"]  # USR2, requeue, rerun
    prov = json.loads((cell / "provenance" / "train.json").read_text())
    first, second = prov["submissions"]
    assert [a["job_id"] for a in first["attempts"]] == [job] * 3
    assert [a["restart_count"] for a in first["attempts"]] == [0, 1, 2]
    assert second["job_id"] != job and second["attempts"][0]["outcome"] == "completed"

    client = mlflow_client(wd)
    run_id = summary["mlflow_run_id"]
    exp = client.get_experiment_by_name("rq")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`lorarl.cell_id` = 's5'",
                              run_view_type=ViewType.ALL)
    assert [r.info.run_id for r in runs] == [run_id]  # one run, resumed (none superseded or deleted)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["lorarl.job_ids"] == f"{job},{second['job_id']}"
    for key in CORE + ["step_time_s"]:
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, steps + 1)), key
    metrics = pd.read_csv(cell / "metrics.csv")
    assert metrics["step"].tolist() == list(range(1, steps + 1))
    assert not ckpts.exists()

    # the same cell, uninterrupted, in this process's machine (CPU, 1 thread, same seed)
    ref_root = tmp_path / "reference"
    shutil.copytree(wd / "results" / "models", ref_root / "models")
    ref = subprocess.run([sys.executable, "-m", "lorarl.cli", "run", str(wd / "study.yaml"), "s5", "--stages", "train",
                          "--results", str(ref_root), "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_metrics = pd.read_csv(ref_root / "rq" / "s5" / "metrics.csv")
    for key in CORE:
        assert (metrics[key] - ref_metrics[key]).abs().max() <= 1e-5 * max(1.0, ref_metrics[key].abs().max()), key
    got = load_file(str(cell / "adapter" / "adapter_model.safetensors"))
    want = load_file(str(ref_root / "rq" / "s5" / "adapter" / "adapter_model.safetensors"))
    assert max(float(want[k].abs().max()) for k in want if "lora_B" in k) > 1e-4  # it did learn
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_failing_cell_is_reported_and_the_other_completes(models, tmp_path: Path, monkeypatch):
    # the missing model must fail in its job, not at load (lorarl.language.preflight refuses it there): paths that
    # exist only on compute nodes are what LORARL_SKIP_PATH_CHECKS is for
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    axes = {"model": {"values": [{"label": "good", "set": {"model": "local:tiny-test"}},
                                 {"label": "missing", "set": {"model": str(tmp_path / "no-such-model")}}]}}
    wd = workdir_for(tmp_path, models, study("bad", axes))
    proc = snakemake(wd)
    assert proc.returncode != 0
    res = wd / "results" / "bad"
    assert (res / "good" / "summary.json").exists() and (res / "good" / "eval" / "synthetic.json").exists()
    assert not (res / "missing" / "summary.json").exists()
    log = (res / "missing" / "logs" / "train.log").read_text()
    job = json.loads((res / "missing" / "provenance" / "train.json").read_text())["submissions"][0]["job_id"]
    assert f"FAILED: job {job} state FAILED (exitcode 1:0" in log
    assert "[lorarl] error: OSError:" in log and "no-such-model" in log
    assert f"tail of {res / 'missing' / 'logs' / 'train' / f'{job}_0_log.err'}" in log
    tail = log.split("tail of", 1)[1]
    assert 'File "' in tail and "OSError: " in tail  # the job's stderr tail: the end of its traceback
    lines = log.rstrip().splitlines()  # the job's FAILED line; each retry after it refused (not out of memory)
    last = max(i for i, line in enumerate(lines) if "FAILED: job" in line)
    assert lines[last].startswith(f"[lorarl] train missing FAILED: job {job} state FAILED"), log[-3000:]
    after = [line for line in lines[last + 1:] if line.startswith("[lorarl] train")]
    assert all("only out-of-memory failures are retried" in line for line in after), log[-3000:]
    # the default profile is quiet about rules; the onerror handler lists every failed stage at the end
    assert "[lorarl] bad: FAILED missing train" in proc.stderr + proc.stdout
    rows = status(wd)
    assert rows["good"]["train"]["state"] == "done"
    assert rows["missing"]["train"]["state"] == "failed" and rows["missing"]["train"]["job"] == job
    assert "FAILED" in rows["missing"]["train"]["detail"] and "OSError" in rows["missing"]["train"]["detail"]
