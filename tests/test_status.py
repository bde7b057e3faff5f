"""`lorarl status` from files alone (no cluster: local-executor provenance), the launcher's small
pieces, and the Slurm profile as Snakemake resolves it from the repo root (dry runs, no cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorarl.train import checkpoint
from lorarl import jobids, provenance
from lorarl.pipeline.jobs.launch import error_summary
from lorarl.pipeline.jobs.slurm import coerce, slurm_parameters
from lorarl.status import format_table, study_status
from lorarl.language.study import study_cells, load_study
from tests.support.study import seeds, tiny_study

REPO = Path(__file__).resolve().parents[1]

STUDY = tiny_study("st", task=None, adapter=None, eval=None, train={"steps": 20}, axes=seeds(0, 1, 2, 3, 4))


def _submit(res: Path, cell: str, stage: str = "train", pid: int | None = None) -> Path:
    prov = provenance.provenance_path(res, "st", cell, stage)
    i = provenance.record_submission(prov, stage=stage, study="st", cell=cell, config_hash=None,
                                     executor="local", slurm=None)
    provenance.record_job_id(prov, i, str(pid or 999999999))
    return prov


def _checkpoint(res: Path, cell: str, step: int, pid: int) -> None:
    root = res / "st" / ".checkpoints" / cell
    (root / f"checkpoint-{step}").mkdir(parents=True)
    (root / f"checkpoint-{step}" / checkpoint.MARKER).write_text(json.dumps({"step": step, "mlflow_run_id": "r"}))
    (root / checkpoint.PROGRESS).write_text(json.dumps({"step": step + 1, "max_steps": 20, "pid": pid}))


def test_status_of_each_kind_of_cell(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(provenance, "pip_freeze", lambda *a, **k: ["lorarl==0"])  # tested below; slow-ish
    monkeypatch.setattr(provenance, "git_info", lambda *a, **k: {"sha": "x", "dirty": False, "diff": "", "untracked": []})
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    study = load_study(tmp_path / "study.yaml")
    res = tmp_path / "results"
    cells = {c.id: c for c in study_cells(study)}
    # s0 done; s1 running (this process is "the job"); s2 failed with a checkpoint; s3 stale; s4 nothing
    (res / "st" / "s0").mkdir(parents=True)
    (res / "st" / "s0" / "summary.json").write_text(json.dumps({"config_hash": cells["s0"].hash}))
    _submit(res, "s1", pid=os.getpid())
    _checkpoint(res, "s1", 10, os.getpid())
    _submit(res, "s2")
    _checkpoint(res, "s2", 8, 999999999)
    (res / "st" / "s2" / "logs").mkdir(parents=True)
    (res / "st" / "s2" / "logs" / "train.log").write_text(
        "[lorarl] error: OSError: no such model\n[lorarl] train s2 FAILED: job 1 state FAILED\n")
    (res / "st" / "s3").mkdir(parents=True)
    (res / "st" / "s3" / "summary.json").write_text(json.dumps({"config_hash": "0123456789"}))

    from lorarl import status as status_mod

    asked = []  # local jobs only: Slurm is not asked (a local job id is a pid, and an unreachable controller
    monkeypatch.setattr(status_mod, "_run", lambda cmd: asked.append(cmd))  # makes each call wait its timeout)
    rows = {r.cell: r for r in study_status(str(tmp_path / "study.yaml"), res)}
    assert asked == []
    assert rows["s0"].train.state == "done"
    assert rows["s1"].train.state == "running" and rows["s1"].train.step == "11/20"
    assert rows["s2"].train.state == "failed"
    assert "OSError: no such model" in rows["s2"].train.detail and "resumes from step 8" in rows["s2"].train.detail
    assert rows["s3"].train.state == "stale"
    assert rows["s4"].train.state == "not started" and rows["s4"].evaluate.state == "not started"
    assert rows["base"].train.state == "-"
    table = format_table(list(rows.values()))
    assert "11/20" in table and "1 done, 1 failed, 1 not started, 1 running, 1 stale" in table

    cli = subprocess.run([sys.executable, "-m", "lorarl.cli", "status", str(tmp_path / "study.yaml"), "--results",
                          str(res), "--json"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert {r["cell"]: r["train"]["state"] for r in json.loads(cli.stdout)}["s2"] == "failed"


def test_provenance_keeps_every_job_and_attempt(tmp_path: Path, monkeypatch):
    prov = tmp_path / "p" / "train.json"
    i = provenance.record_submission(prov, stage="train", study="st", cell="s0", config_hash="h", executor="slurm",
                                     slurm={"partition": "gpu"})
    provenance.record_job_id(prov, i, "41")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    provenance.record_attempt_start(prov, i)
    provenance.record_attempt_end(prov, i, "interrupted")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    provenance.record_attempt_start(prov, i)
    provenance.record_attempt_end(prov, i, "completed")
    j = provenance.record_submission(prov, stage="train", study="st", cell="s0", config_hash="h", executor="slurm",
                                     slurm={})
    provenance.record_job_id(prov, j, "57")
    doc = provenance.read(prov)
    assert jobids.job_ids(doc) == ["41", "57"]
    k = provenance.record_submission(prov, stage="train", study="st", cell="s0", config_hash="h", executor="local",
                                     slurm=None)
    provenance.record_job_id(prov, k, "4242")
    doc = provenance.read(prov)
    assert jobids.job_ids(doc) == ["41", "57", "4242"] and jobids.job_ids(doc, executor="slurm") == ["41", "57"]
    assert [(a["restart_count"], a["outcome"]) for a in provenance.attempts(doc)] == [(0, "interrupted"),
                                                                                        (1, "completed")]
    sub = doc["submissions"][0]
    assert sub["git"]["sha"] and sub["host"] and sub["attempts"][0]["gpu"]
    assert (prov.parent / sub["pip_freeze"]).exists()
    assert doc["submissions"][1]["pip_freeze"] == sub["pip_freeze"]  # stored once by content


def test_profile_values_are_restored_to_numbers():
    assert coerce({"mem_gb": "64", "timeout_min": "1.5", "exclusive": "True", "setup": ["echo 1"],
                   "partition": "gpu"}) == {"mem_gb": 64, "timeout_min": 1.5, "exclusive": True,
                                            "setup": ["echo 1"], "partition": "gpu"}
    ctor, params = slurm_parameters({"partition": "gpu", "gpus_per_node": "1", "max_num_timeout": "5",
                                     "account": "a", "signal_delay_s": "120"})
    assert ctor == {"slurm_max_num_timeout": 5}
    assert params == {"slurm_partition": "gpu", "gpus_per_node": 1, "slurm_account": "a",
                      "slurm_signal_delay_s": 120}


def test_error_summary_is_the_job_exception():
    from submitit.core.utils import FailedJobError, UncompletedJobError

    err = FailedJobError("Job (task=0) failed during processing with trace:\n----------------------\n"
                         "Traceback (most recent call last):\n  File \"x.py\", line 1\nOSError: no model\n\n"
                         "----------------------\nYou can check full logs")
    assert error_summary(err) == "OSError: no model"
    assert error_summary(UncompletedJobError("Job 3 (task: 0) with path x\nhas not produced any output "
                                             "(state: CANCELLED by 0)")).startswith("UncompletedJobError: Job 3")


def _dry_run(profile: str, wd: Path) -> str:
    (wd / "study.yaml").write_text(yaml.safe_dump(STUDY))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # cwd = the repo root, where the user types it; the outputs of this dry run would go to wd. A
    # `--config studies=...` must not lose the profile's launcher (it would run everything locally).
    # `--quiet host`: the default profile is quiet about rules (issue 13); this test reads the commands
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--quiet", "host", "all", "--profile", profile,
                           "--directory", str(wd), "--config", f"studies={json.dumps([str(wd / 'study.yaml')])}",
                           "results=results"], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("profile", ["slurm", "profiles/slurm"])
def test_slurm_profile_resolves_from_the_repo_root(profile: str, tmp_path: Path):
    """`snakemake --profile slurm all` from the repo root: launcher slurm, per-stage resources from the
    profile (not overridden by the default workflow profile), launchers cost no local core."""
    out = _dry_run(profile, tmp_path)
    train = next(line for line in out.splitlines() if "lorarl launch train" in line)
    assert "--executor slurm --threads 0" in train
    assert "--tracking http://127.0.0.1:5000 " in train  # the profile's MLflow store reaches every job
    slurm = json.loads(train.split("--slurm '")[1].split("'")[0])
    want = yaml.safe_load((REPO / "profiles" / "slurm" / "cluster.yaml").read_text())["slurm"]["train"]
    assert slurm == want and slurm["partition"] == "gpu" and slurm["gpus_per_node"] == 1
    assert "aggregate" in out and "lorarl aggregate" in out  # still a local rule


def test_status_lists_a_toy_study_that_never_started(tmp_path: Path, capsys):
    """`lorarl status` of the published toy study (its cells have no train steps: no rung to look for) lists every
    cell as not started, exit 0."""
    from lorarl import cli

    study = load_study(REPO / "experiments" / "kl_bound_toy.yaml")
    assert cli.main(["status", str(REPO / "experiments" / "kl_bound_toy.yaml"), "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{c.id} " in out for c in study_cells(study)) and "not started" in out
