"""`lorarl status --watch`: compact counts, running steps, failures, flags and an ETA from measured
step times; a few lines whatever the number of cells; ends when the study does."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import yaml

from lorarl.train import checkpoint
from lorarl import provenance
from lorarl.language.study import load_study, study_cells
from lorarl.pipeline.progress.watch import render, snapshot, watch
from tests.support.study import tiny_study


def _study(tmp: Path, n: int) -> Path:
    p = tmp / "w.yaml"
    p.write_text(yaml.safe_dump(tiny_study("w", task=None, adapter=None, eval=None, train={"steps": 20},
                                           axes={"seed": {"field": "seed", "prefix": "s", "values": list(range(n))}})))
    return p


def _done(res: Path, cell, step_s: float = 0.5, flags: dict | None = None) -> None:
    d = res / "w" / cell.id
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"config_hash": cell.hash, "mean_step_time_s": step_s,
                                                "state": "done", "flags": flags or {}}))


def _running(res: Path, cell_id: str, step: int, pid: int) -> None:
    prov = provenance.provenance_path(res, "w", cell_id, "train")
    i = provenance.record_submission(prov, stage="train", study="w", cell=cell_id, config_hash=None,
                                     executor="local", slurm=None)
    provenance.record_job_id(prov, i, str(pid))
    root = res / "w" / ".checkpoints" / cell_id
    root.mkdir(parents=True, exist_ok=True)
    (root / checkpoint.PROGRESS).write_text(json.dumps({"step": step, "max_steps": 20, "pid": pid}))


def test_watch_counts_steps_failures_and_eta(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "pip_freeze", lambda *a, **k: ["lorarl==0"])
    monkeypatch.setattr(provenance, "git_info", lambda *a, **k: {"sha": "x", "dirty": False, "diff": "", "untracked": []})
    sp = _study(tmp_path, 12)
    res = tmp_path / "results"
    cells = study_cells(load_study(sp))
    for c in cells[:4]:
        _done(res, c, 0.5, {"reward_collapse": 9} if c.id == "s2" else None)
    _running(res, "s4", 10, os.getpid())  # this process is "the job": 10/20 steps
    _running(res, "s5", 0, 999999999)  # a dead job whose log says it failed
    (res / "w" / "s5" / "logs").mkdir(parents=True)
    (res / "w" / "s5" / "logs" / "train.log").write_text("[lorarl] error: OSError: disk full\n")
    s = snapshot(str(sp), res)
    assert s["counts"] == {"done": 4, "running": 1, "failed": 1, "not started": 6}
    assert s["running"] == ["s4 10/20"] and s["failed"] == ["s5 (OSError: disk full)"]
    assert s["flags"] == ["reward_collapse 1 cell (first s2@9)"]
    # left: s4's 10 steps + 6 unstarted x 20 (the failed cell is not counted) = 130 steps x 0.5 s, 1 in parallel;
    # no job of this run has finished and there is no doctor's projection: the other jobs are not counted (the base
    # model, the 11 cells' evaluations and diagnostics (none of s5, which failed), the base's evaluation, aggregation)
    assert s["steps_left"] == 130 and s["eta_s"] == pytest.approx(65.0) and not s["ended"]
    assert s["eta_lower_bound"] and s["jobs_left"] == {"base": 1, "train": 7, "evaluate": 12, "diagnose": 11,
                                                       "aggregate": 1}
    text = render(s)
    assert "12 cells: 4 done, 1 running, 1 failed, 6 not started" in text and "ETA >= 1m05s" in text
    assert "untimed: agg, base, diag, eval, train start" in text
    out = io.StringIO()
    assert watch(str(sp), res, interval=0, max_updates=2, out=out) == 1  # a failed cell: exit 1
    assert out.getvalue().count("12 cells:") == 2
    for c in cells:  # every cell finished: the watch ends by itself
        _done(res, c)
    out = io.StringIO()
    assert watch(str(sp), res, interval=3600, out=out) == 0
    assert "ended" in out.getvalue()


def test_watch_stays_compact_at_1000_cells(tmp_path):
    sp = _study(tmp_path, 1000)
    res = tmp_path / "results"
    for i, c in enumerate(study_cells(load_study(sp))):
        if i % 3 == 0:
            _done(res, c, 0.2, {"adv_std_spike": 10 + i % 7})
    text = render(snapshot(str(sp), res))
    lines = text.splitlines()
    assert len(lines) == 6 and max(map(len, lines)) < 160, text  # + its base model's line (none built here)
    assert lines[-1].startswith("base model ") and lines[-1].endswith(": not started"), text
    assert "1000 cells: 334 done" in text and "adv_std_spike 334 cells (first s0@10)" in text


def _finished(res: Path, cell: str, stage: str, seconds: float) -> None:
    """A finished job's provenance: submitted ``seconds`` before it ended."""
    prov = res / "w" / cell / "provenance" / f"{stage}.json"
    prov.parent.mkdir(parents=True, exist_ok=True)
    prov.write_text(json.dumps({"submissions": [{
        "submitted_at": "2026-01-01T00:00:00+0000", "executor": "local", "job_id": "1",
        "attempts": [{"started_at": "2026-01-01T00:00:02+0000", "outcome": "completed",
                      "ended_at": f"2026-01-01T00:{int(seconds) // 60:02d}:{int(seconds) % 60:02d}+0000"}]}]}))


def test_eta_counts_every_job_left_with_this_runs_job_times(tmp_path, monkeypatch):
    """Training, evaluations, diagnostics and the aggregation still to run, each timed from this run's finished jobs
    of its kind (a training job: its start-up, the finished one's time less its steps, plus its steps), the
    aggregation from the doctor's projection; scheduled on the doctor's profile slots."""
    monkeypatch.setattr(provenance, "pip_freeze", lambda *a, **k: ["lorarl==0"])
    monkeypatch.setattr(provenance, "git_info", lambda *a, **k: {"sha": "x", "dirty": False, "diff": "", "untracked": []})
    sp = _study(tmp_path, 2)
    res = tmp_path / "results"
    (res / "models" / "tiny-test").mkdir(parents=True)
    (res / "models" / "tiny-test" / "config.json").write_text("{}")  # built: no base model job
    s0, s1 = study_cells(load_study(sp))
    _done(res, s0, 0.5)  # 20 steps of 0.5 s
    (res / "w" / "s0" / "eval").mkdir(parents=True)
    (res / "w" / "s0" / "eval" / "synthetic.json").write_text("{}")
    (res / "w" / "s0" / "diagnostics.parquet").write_text("")
    _finished(res, "s0", "train", 100)  # start-up etc. 100 - 20 x 0.5 = 90 s
    _finished(res, "s0", "evaluate-synthetic", 30)
    _finished(res, "s0", "diagnose", 20)
    (res / "w" / "doctor").mkdir(parents=True)
    (res / "w" / "doctor" / "doctor.json").write_text(json.dumps({"projection": {
        "concurrent_jobs": 1, "shared_machine": False, "schedule": [
            {"kind": "aggregate", "cell": "w", "target": "", "after": [], "cpu_s": 3.0, "wait_s": 2.0}]}}))
    s = snapshot(str(sp), res)
    # s1: train 90 + 20 x 0.5, evaluate 30, diagnose 20; the base's evaluation 30; the aggregation 5: one at a time
    assert s["jobs_left"] == {"train": 1, "evaluate": 2, "diagnose": 1, "aggregate": 1} and not s["eta_lower_bound"]
    assert s["eta_s"] == pytest.approx(100 + 30 + 20 + 30 + 5)
    text = render(s)
    assert "ETA 3m05s (5 jobs: 1 train, 2 eval, 1 diag, 1 agg; step 0.50s from 1 cells" in text
    assert "times: the doctor + this run; 1 at once" in text
    _running(res, "s1", 10, os.getpid())  # s1 trains (this process is "the job"): its 10 steps left, no start-up
    assert snapshot(str(sp), res)["eta_s"] == pytest.approx(10 * 0.5 + 30 + 20 + 30 + 5)


def test_progress_counts_the_seeds_a_hypothesis_added(tmp_path):
    """An adaptive study whose hypothesis added seeds: the snapshot (the console's line, `status --watch`) counts
    their cells and their steps, as `lorarl status` does (it raised KeyError on them)."""
    import copy

    from tests.support.adaptive_results import STUDY, adaptive_results

    spec = copy.deepcopy(STUDY)
    spec["axes"]["seed"]["values"] = [0]  # the hypothesis needs 2: it adds seed 1
    f, study, table, res = adaptive_results(tmp_path, spec, added=True)
    extra = [c for c in table.extra_cells() if (res / study.name / c.id).is_dir()]
    assert extra  # the hypothesis's added seeds were started
    s = snapshot(str(f), res)
    assert s["n"] == len(table.cells) + len(extra)
    steps = sum(c.config.train.optimizer_updates for c in [*table.cells, *extra])
    assert s["steps_total"] == steps


def test_watch_of_the_toy_study_counts_cells_and_leaves_its_one_job_untimed(tmp_path):
    """The published toy study (kind kl_bound_toy: one batch job runs every cell, no optimiser steps): each cell is
    one unit of progress (lorarl.language.kinds.Kind.updates), the ETA is unknown while the batch job is to run (not
    0 s), and the watch ends once every cell has its summary."""
    sp = Path(__file__).resolve().parents[2] / "experiments" / "kl_bound_toy.yaml"
    study = load_study(sp)
    cells = study_cells(study)
    s = snapshot(str(sp), tmp_path)
    assert (s["n"], s["steps_total"], s["progress"], s["ended"]) == (len(cells), len(cells), 0.0, False)
    assert s["eta_s"] is None and s["jobs_left"] == {"toy": 1}, s
    assert "ETA ? (1 jobs: 1 toy" in render(s)
    for c in cells[:-1]:
        d = tmp_path / study.name / c.id
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"config_hash": c.hash, "state": "done"}))
    assert snapshot(str(sp), tmp_path)["progress"] == pytest.approx(1 - 1 / len(cells))
    d = tmp_path / study.name / cells[-1].id
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"config_hash": cells[-1].hash, "state": "done"}))
    out = io.StringIO()
    assert watch(str(sp), tmp_path, interval=0, out=out) == 0
    assert "ended" in out.getvalue() and "100%" in out.getvalue()
