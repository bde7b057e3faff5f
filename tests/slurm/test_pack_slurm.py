"""A pack job on the real Slurm test cluster, preempted (issue 14): Slurm's USR2 (what preemption
sends; submitit requeues) makes every member checkpoint, the requeued job resumes each member from its
own checkpoint, and each cell ends with every (metric, step) exactly once in metrics.csv and in its one
MLflow run. Then `scontrol requeue` (SIGTERM, no checkpoint call) and the same guarantees. A resident job
(`pack: {resident: true, places: 2}`, issue 39) requeues the same way, after it has re-formed its pack."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.entities import ViewType

from tests.support.slurm import REPO, env, mlflow_client, snakemake_cmd, study, wait_progress, workdir_for

pytestmark = pytest.mark.slurm
CELLS = ("s0", "s1")


def _preempt_twice(tmp_path: Path, wd: Path, pack: str, progress: list[Path], cells: list[str]) -> None:
    """Snakemake, asked for the pack job's record and its members' trained outputs (the training jobs, no evaluation:
    a member's summary.json alone would train it solo), with ``pack``; once the members reach step 4: USR2 (what
    preemption sends; submitit requeues), then, once they trained 4 more steps in the requeued job, `scontrol
    requeue` (SIGTERM, no checkpoint() call); the run must then finish."""
    from lorarl.pack.plan import pack_id

    name = yaml.safe_load((wd / "study.yaml").read_text())["name"]
    pid = pack_id(cells, resident="resident" in pack)  # a resident job's id differs from a fixed pack's of the same cells
    targets = (f"results/{name}/.packs/{pid}.json", *(f"results/{name}/{c}/summary.json" for c in cells))
    log = (tmp_path / "snakemake.log").open("w")
    proc = subprocess.Popen(snakemake_cmd(wd, targets=targets) + [pack], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env=env())
    try:
        p = wait_progress(progress, 4, None, proc)
        job = p["job_id"]
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)  # what preemption does
        p = wait_progress(progress, p["step"] + 4, p["pid"], proc)  # requeued, every member resumed, trained on
        assert p["job_id"] == job  # the same (requeued) job
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)  # SIGTERM, no checkpoint() call
        wait_progress(progress, p["step"] + 2, p["pid"], proc)
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert rc == 0, (tmp_path / "snakemake.log").read_text()[-5000:]


def test_preempted_pack_requeues_and_resumes_every_member_exactly_once(models, tmp_path: Path):
    steps = 36
    spec = study("pk", {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}, steps=steps, checkpoint_every=4)
    wd = workdir_for(tmp_path, models, spec)
    res = wd / "results" / "pk"
    _preempt_twice(tmp_path, wd, "pack=2", [res / ".checkpoints" / c / "progress.json" for c in CELLS], list(CELLS))
    (record,) = (res / ".packs").glob("pack-*.json")
    rec = json.loads(record.read_text())
    assert rec["trained"] == list(CELLS) and rec["states"] == {c: "done" for c in CELLS}, rec
    summaries = _check_members(wd, "pk", {c: steps for c in CELLS}, {c: 2 for c in CELLS})
    for summary in summaries.values():
        assert summary["pack"]["members"] == list(CELLS) and all(s >= 4 for s in summary["resumed_from_steps"])


def _check_members(wd: Path, study_name: str, cells: dict[str, int], resumes: dict[str, int]) -> dict:
    """Each cell: done, `resumes` resumes, every (metric, step) once in metrics.csv and its one MLflow run."""
    res = wd / "results" / study_name
    client = mlflow_client(wd)
    exp = client.get_experiment_by_name(study_name)
    out = {}
    for c, steps in cells.items():
        d = res / c
        summary = out[c] = json.loads((d / "summary.json").read_text())
        assert summary["state"] == "done" and len(summary["resumed_from_steps"]) == resumes[c], (c, summary)
        assert pd.read_csv(d / "metrics.csv")["step"].tolist() == list(range(1, steps + 1)), c
        runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`lorarl.cell_id` = '{c}'",
                                  run_view_type=ViewType.ALL)
        assert [r.info.run_id for r in runs] == [summary["mlflow_run_id"]], c  # one run, however often resumed
        for key in ("reward", "loss"):
            got = sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], key))
            assert got == list(range(1, steps + 1)), (c, key, got)
        assert (d / "adapter" / "adapter_model.safetensors").exists() and not (d / ".packed").exists()
        assert not (res / ".checkpoints" / c).exists()
    return out


def test_preempted_resident_job_requeues_and_resumes_every_member_exactly_once(models, tmp_path: Path):
    """One resident job of 2 places for cells of 8, 40 and 36 steps: n8 ends at 8, n40 pauses there and n36
    takes the freed place; then USR2 and `scontrol requeue` as above. The requeued job claims the members
    again (n8, published meanwhile by its own train job, is skipped) and resumes each from its checkpoint."""
    cells = {"n8": 8, "n40": 40, "n36": 36}
    spec = study("pr", {"length": {"field": "train.steps", "prefix": "n", "values": list(cells.values())}},
                 checkpoint_every=4)
    wd = workdir_for(tmp_path, models, spec)
    ckpt = [wd / "results" / "pr" / ".checkpoints" / c / "progress.json" for c in ("n36", "n40")]
    _preempt_twice(tmp_path, wd, "pack={resident: true, places: 2}", ckpt, list(cells))  # n36: 4 after the re-form
    res = wd / "results" / "pr"
    (record,) = [r for r in (res / ".packs").glob("pack-*.json") if not r.name.endswith(".ledger.json")]
    rec = json.loads(record.read_text())  # the last process's record: the members it resumed
    assert rec["resident"] == 2 and rec["trained"] == ["n36", "n40"] and "n8" in rec["left_out"], rec
    ledger = json.loads(record.with_suffix(".ledger.json").read_text())["segments"]
    # every process's admissions: the first's two, then one per requeued process (USR2's, then SIGTERM's)
    assert [(s["run"], s["admitted"]) for s in ledger] == [(0, ["n8", "n40"]), (0, ["n40", "n36"]),
                                                           (1, ["n40", "n36"]), (2, ["n40", "n36"])], ledger
    summaries = _check_members(wd, "pr", cells, {"n8": 0, "n40": 3, "n36": 2})
    assert summaries["n40"]["resumed_from_steps"][0] == 8  # the slot boundary, then USR2's and SIGTERM's
    assert all(s >= 4 for c in ("n40", "n36") for s in summaries[c]["resumed_from_steps"]), summaries
    assert all(s["pack"]["resident"] == 2 for s in summaries.values())
