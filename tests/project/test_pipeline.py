"""End to end through Snakemake: a 2-cell study, few steps, in a temp directory (real training); `lorarl doctor`'s
projection of the same run, against its measured wall time."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support.snakemake import REPO, STUDY, active_cell_runs, jobs_run, run_snakemake, study_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return study_dir(tmp_path_factory.mktemp("pipeline"))


def doctor_projection(workdir: Path) -> dict:
    """`lorarl doctor` on the study, into the study's results (it builds the base model the run would build)."""
    from lorarl.cli import main

    assert main(["doctor", str(workdir / "study.yaml"), "--results", str(workdir / "results")]) == 0
    return json.loads((workdir / "results" / "e2e" / "doctor" / "doctor.json").read_text())["projection"]


def projection_trial(wd: Path) -> dict:
    """`lorarl doctor` on the study in ``wd``, then the study's whole run, timed under a load sampler: the doctor's
    projection under the run's load (``now``) beside the measured wall time (``took``)."""
    from lorarl.pipeline.doctor.clock import LoadSampler, child_cpu_s
    from lorarl.pipeline.doctor.jobs import wall_under
    from lorarl.pipeline.progress.watch import snapshot

    projected = doctor_projection(wd)
    before = snapshot(str(wd / "study.yaml"), wd / "results")  # status --watch: every job, from the doctor
    with LoadSampler() as load:  # the machine's load during the run, sampled as the doctor job sampled it
        t0, c0 = time.perf_counter(), child_cpu_s()
        run = run_snakemake(wd, "all")
        took, cpu = time.perf_counter() - t0, child_cpu_s() - c0
    during = load.summary()
    now = wall_under(projected, during)
    line = (f"measured {took:.0f} s ({cpu:.0f} CPU-s); projected {now:.0f} s under the run's load "
            f"(1 thread: {during['capacity'][1]:.2f} CPU), {projected['wall_h'] * 3600:.0f} s under the doctor's "
            f"({projected['load']['capacity']['1']:.2f} CPU), {projected['wall_idle_h'] * 3600:.0f} s idle; "
            f"{sum(r['cpu_s'] for r in projected['schedule']):.0f} CPU-s; watch ETA before the run "
            f"{before['eta_s']:.0f} s")
    return {"projected": projected, "before": before, "run": run, "took": took, "now": now, "line": line}


def within(trial: dict, share: float = 0.25) -> bool:
    """The projection under the run's load within ``share`` of the measured wall time, and the watch's ETA before the
    run (every job charged at the profile's full concurrency) within ``share`` of the doctor's projection."""
    wall = trial["projected"]["wall_h"] * 3600
    return (abs(trial["now"] - trial["took"]) <= share * trial["took"]
            and abs(trial["before"]["eta_s"] - wall) <= share * wall)


def test_full_pipeline_then_noop_then_single_cell_rerun(workdir: Path, tmp_path: Path, capsys):
    trial = projection_trial(workdir)
    projected, before, first = trial["projected"], trial["before"], trial["run"]
    assert not before["eta_lower_bound"] and before["jobs_left"] == {"train": 2, "evaluate": 3, "diagnose": 2,
                                                                     "aggregate": 1}
    stats = jobs_run(first)
    assert stats.get("train") == 2 and stats.get("evaluate") == 3 and stats.get("aggregate") == 1, stats
    assert "[lorarl] e2e report : results/e2e/report.html" in first.stdout  # onsuccess names the outputs (console.py)
    # the doctor projects every job the run executes (its base model is built: none here), each with its start-up,
    # scheduled on the profile's 2 cores; under the run's own load the projection is within 25% of the measured time
    assert projected["jobs"] == {k: n for k, n in stats.items() if k != "all"}, (projected["jobs"], stats)
    with capsys.disabled():
        print(f"\n[projection] {trial['line']}")
    if not within(trial):
        # The wall time of one trial on a shared 2-core machine moves with what its neighbours run from minute to
        # minute, which the 1-second load samples only partly see (bench/results/doctor-projection.md: 15 runs of
        # this test gave 0.84-1.29 of the measured time, two of them outside 25%; the watch's ETA, from the same
        # doctor's figures, came to 0.97-1.19 of its projection). A miss of either is retried once, from scratch in a fresh
        # directory (doctor, base model, run): the bound holds for that trial, and both are printed. CI runs this
        # module alone, after its other processes (scripts/test.sh, ALONE): beside them both trials once missed.
        trial = projection_trial(study_dir(tmp_path))
        with capsys.disabled():
            print(f"[projection] outside 25%; again from scratch: {trial['line']}")
    assert within(trial), (trial["now"], trial["took"], trial["projected"]["startup"], trial["line"])
    res = workdir / "results"
    for cell in ("s0", "s1"):
        d = res / "e2e" / cell
        for f in ("cell.json", "metrics.csv", "summary.json", "adapter/adapter_config.json",
                  "eval/synthetic.json", "eval/synthetic.jsonl"):
            assert (d / f).exists(), f
        assert len(pd.read_csv(d / "metrics.csv")) == 3
        assert not (d / ".train.tmp").exists()
    runs, client = active_cell_runs(res)
    assert sorted(r.data.tags["lorarl.cell_id"] for r in runs) == ["s0", "s1"]
    for r in runs:
        assert r.data.params["adapter.rank"] == "2" and r.data.tags["axis.seed"] in ("0", "1")
        assert r.data.metrics["cost/cpu_core_h"] > 0 and r.data.metrics["cost/gpu_h"] == 0
        assert r.data.tags["git.sha"] and r.data.tags["version.trl"]
        assert len(client.get_metric_history(r.info.run_id, "reward")) == 3
        assert "eval/synthetic/pass_at_1" in r.data.metrics
    table = pd.read_csv(res / "e2e" / "tables" / "summary.csv")
    assert int(table["n_seeds"].iloc[0]) == 2
    # the cost ledger (lorarl.ledger): one record per job, rolled up into cost.csv and cost/* (docs/report.md#cost-ledger)
    for cell in ("s0", "s1"):
        keys = sorted(json.loads(p.read_text())["key"] for p in (res / "e2e" / cell / "cost").glob("*.json"))
        assert keys == ["diagnose", "evaluate-synthetic", "train"], keys
    cost = pd.read_csv(res / "e2e" / "tables" / "cost.csv").set_index(["level", "name"])
    total = cost.loc[("study", "e2e")]
    assert total["unit"] == "cpu" and total["gpu_h"] == 0 and total["cpu_core_h"] > 0
    assert total["phase/update_h"] > 0 and total["phase/generation_h"] > 0 and total["stage/train_h"] > 0
    assert cost.loc[("cell", "s0"), "cpu_core_h"] > 0
    assert (res / "e2e" / "tables" / "cells.csv").read_text().count("\n") == 3
    assert (res / "e2e" / "figures" / "train_reward.png").stat().st_size > 1000
    # the aggregate stage writes the report too; the default profile keeps the log short (issue 13)
    assert "data:image/png;base64," in (res / "e2e" / "report.html").read_text()
    assert "two-level t interval over seeds and evaluation problems" in (res / "e2e" / "tables" / "stats.md").read_text()
    assert "output:" not in first.stderr and "steps (100%) done" in first.stderr
    for line in ("(Rule: train): e2e/s0", "(Rule: train): e2e/s1", "(Rule: evaluate): e2e/base synthetic",
                 "(Rule: diagnose): e2e/s0", "(Rule: aggregate): e2e"):  # each progress line names its job
        # (the base model's line: the doctor built it before this run; tests/pipeline/test_snakelog.py names it)
        assert re.search(rf"^Finished jobid: \d+ {re.escape(line)}$", first.stderr, re.M), (line, first.stderr[-3000:])
    [parent] = [r for r in client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
                if r.data.tags.get("lorarl.study_run") == "true"]
    # one invocation, no gap: about the parent's duration (its first job started before it opened the store)
    last, wall = parent.data.metrics["study/last_run_wall_time_s"], parent.data.metrics["study/wall_time_s"]
    assert 0 < last <= wall + 120, parent.data.metrics
    from tests.support.cdp import chromium, load_page

    if chromium():  # the page of a real run renders in a browser: every figure decoded, no console error
        seen = load_page(res / "e2e" / "report.html", chromium())
        assert seen["images"] and all(i["naturalWidth"] > 0 for i in seen["images"]) and seen["errors"] == []

    second = run_snakemake(workdir, "all")
    assert "Nothing to be done" in second.stderr + second.stdout
    # runtime settings are not science: another training layout, partition or time limit reruns nothing
    layout = json.dumps({"train": {"tasks_per_node": 2, "partition": "big", "timeout_min": 9},
                         "evaluate": {"mem_gb": 9}})
    moved = run_snakemake(workdir, "all", "--config", f"slurm={layout}", "-n")
    assert "Nothing to be done" in moved.stderr + moved.stdout, moved.stderr[-3000:]

    s0_before = (res / "e2e" / "s0" / "summary.json").stat().st_mtime_ns
    s1_run = json.loads((res / "e2e" / "s1" / "summary.json").read_text())["mlflow_run_id"]
    forced = run_snakemake(workdir, "all", "--forcerun", "results/e2e/s1/summary.json")
    stats = jobs_run(forced)
    assert stats.get("train") == 1 and stats.get("evaluate") == 1, stats
    assert (res / "e2e" / "s0" / "summary.json").stat().st_mtime_ns == s0_before
    runs, client = active_cell_runs(res)
    assert sorted(r.data.tags["lorarl.cell_id"] for r in runs) == ["s0", "s1"]  # one current run per cell
    old = client.get_run(s1_run)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["lorarl.superseded"] == "true"


def test_deleting_a_cell_reruns_exactly_that_cell(workdir: Path):
    shutil.rmtree(workdir / "results" / "e2e" / "s0")
    proc = run_snakemake(workdir, "all")
    stats = jobs_run(proc)
    assert stats.get("train") == 1 and stats.get("evaluate") == 1 and "base_model" not in stats, stats


def test_failed_cell_keeps_finished_cells(workdir: Path):
    """A bad model path fails its cell (non-zero, log tail reported); other cells stay intact."""
    bad = dict(STUDY, name="e2ebad")
    bad["axes"] = {"model": {"values": [{"label": "good", "set": {"model": "local:tiny-test"}},
                                        {"label": "missing", "set": {"model": str(workdir / "no-such-model")}}]}}
    (workdir / "bad.yaml").write_text(yaml.safe_dump(bad))
    cfg = yaml.safe_load((workdir / "config.yaml").read_text())
    (workdir / "config_bad.yaml").write_text(yaml.safe_dump({**cfg, "studies": [str(workdir / "bad.yaml")]}))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config_bad.yaml"), "--cores", "2", "--keep-going", "all"]
    # The missing path must fail at run time, not at load (lorarl.language.preflight refuses it there): paths
    # that exist only on compute nodes are what LORARL_SKIP_PATH_CHECKS is for.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "LORARL_SKIP_PATH_CHECKS": "1"}
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)
    assert proc.returncode != 0, proc.stderr[-3000:]
    cells = {p.name for p in (workdir / "results" / "e2ebad").iterdir()}
    assert {"good", "missing"} <= cells
    assert (workdir / "results" / "e2ebad" / "good" / "summary.json").exists()
    assert (workdir / "results" / "e2ebad" / "good" / "eval" / "synthetic.json").exists()
    assert not (workdir / "results" / "e2ebad" / "missing" / "summary.json").exists()
    log = (workdir / "results" / "e2ebad" / "missing" / "logs" / "train.log").read_text()
    assert "FAILED" in log and "state" in log and "tail of" in log
