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
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm

SLURM = {
    "base": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
    "train": {"partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 60,
              "signal_delay_s": 30},
    "evaluate": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
    "diagnose": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
}
CORE = ["reward", "loss", "grad_norm", "entropy", "num_tokens"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """results/models/tiny-test, built once (copied into every workdir so no test rebuilds it), and a
    perturbed copy as a distillation teacher (varied rewards: the adapter really learns)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lorarl.models import build_base

    root = tmp_path_factory.mktemp("slurm_models")
    base = root / "models" / "tiny-test"
    build_base("tiny-test", base, threads=1)
    teacher = root / "teacher"
    model, tok = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(teacher)
    tok.save_pretrained(teacher)
    return base, teacher


def workdir_for(tmp: Path, models: tuple[Path, Path], study: dict) -> Path:
    (tmp / "results" / "models").mkdir(parents=True)
    shutil.copytree(models[0], tmp / "results" / "models" / "tiny-test")
    (tmp / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp


def snakemake_cmd(workdir: Path, slurm: dict = SLURM, targets: tuple[str, ...] = ("all",)) -> list[str]:
    # launcher: slurm comes from the profile (profiles/slurm/cluster.yaml); only the resources shrink
    studies = json.dumps([str(workdir / "study.yaml")])
    return [sys.executable, "-m", "snakemake", *targets, "--profile", "slurm", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), "--config", f"studies={studies}", "results=results",
            "slurm=" + json.dumps(slurm), "tracking=sqlite"]  # the profile's server: tests/test_tracking_server.py


def wait_progress(paths: list[Path], min_step: int, not_pid: int | None, proc: subprocess.Popen,
                  timeout: float = 300) -> dict:
    """The first cell's progress.json once every cell in ``paths`` is at step >= min_step, written by a process
    other than ``not_pid`` (a requeued job's); fails when snakemake ends first or after ``timeout`` s, with what
    the cluster and the jobs' logs say (cluster_report)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ps = [_progress(p) for p in paths]
        if all(p and p["step"] >= min_step and p["pid"] != not_pid for p in ps):
            return ps[0]
        if proc.poll() is not None:
            pytest.fail(f"snakemake ended (rc {proc.returncode}) before step {min_step}: {ps}\n"
                        + cluster_report(paths[0].parents[4]))
        time.sleep(0.1)
    pytest.fail(f"not at step >= {min_step} (from a new process) after {timeout} s: {[_progress(p) for p in paths]}\n"
                + cluster_report(paths[0].parents[4]))


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


def cluster_report(workdir: Path | None = None) -> str:
    """What a failed Slurm test needs to be understood from CI's output alone: the queue with each job's
    reason, the nodes, slurmctld's last lines, and under ``workdir`` the tail of every job log and of
    snakemake.log."""
    def cmd(*argv: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return (out.stdout + out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"({e})"

    parts = [f"$ squeue\n{cmd('squeue', '-h', '-o', '%i %P %j %T %M %D %R')}",
             f"$ sinfo -N\n{cmd('sinfo', '-h', '-N', '-o', '%N %P %t %E')}",
             f"$ scontrol show job\n{cmd('scontrol', '-o', 'show', 'job')}"]
    state = Path(os.environ.get("LORARL_SLURM_DIR", "/tmp/lorarl-slurm"))
    for log in [state / "log" / "slurmctld.log", *sorted((state / "log").glob("slurmd*.log"))]:
        parts.append(f"== {log.name}\n{_tail(log, 20)}")
    if workdir is not None:
        logs = sorted(workdir.rglob("logs/**/*_log.*")) + sorted(workdir.rglob("snakemake.log"))
        for f in logs[-8:]:
            parts.append(f"== {f.relative_to(workdir)}\n{_tail(f)}")
    return "\n".join(parts)


def env() -> dict[str, str]:
    # LORARL_POLL_S: a cancelled job is noticed within seconds (default: a minute)
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "LORARL_POLL_S": "3"}


def snakemake(workdir: Path, timeout: float = 900, slurm: dict = SLURM) -> subprocess.CompletedProcess:
    # cwd = the repo root: `--profile slurm` is looked up there (./slurm -> profiles/slurm)
    return subprocess.run(snakemake_cmd(workdir, slurm), cwd=REPO, capture_output=True, text=True, env=env(),
                          timeout=timeout)


def status(workdir: Path) -> dict[str, dict]:
    out = subprocess.run([sys.executable, "-m", "lorarl.cli", "status", str(workdir / "study.yaml"), "--results",
                          str(workdir / "results"), "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {row["cell"]: row for row in json.loads(out.stdout)}


def study(name: str, axes: dict, **train) -> dict:
    return {
        "name": name,
        "defaults": {
            "model": "local:tiny-test",
            "task": {"name": "synthetic", "n_train": 64, "n_eval": 8},
            "adapter": {"rank": 2, "alpha": 4},
            "train": {"steps": 3, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16, "lr": 1e-3,
                      "checkpoint_every": 2, **train},
            "eval": {"max_new_tokens": 16},
        },
        "axes": axes,
    }


def mlflow_client(workdir: Path):
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")


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


def _progress(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


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
    proc = subprocess.Popen(snakemake_cmd(wd), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=env())
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
    # the missing model must fail in its job, not at load (lorarl.spec.preflight refuses it there): paths that
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
