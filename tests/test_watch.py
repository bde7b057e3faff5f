"""`lorarl status --watch`: compact counts, running steps, failures, flags and an ETA from measured
step times; a few lines whatever the number of cells; ends when the study does."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import yaml

from lorarl.train import checkpoint
from lorarl.pipeline import provenance
from lorarl.study import load_study, study_cells
from lorarl.pipeline.watch import render, snapshot, watch


def _study(tmp: Path, n: int) -> Path:
    p = tmp / "w.yaml"
    p.write_text(yaml.safe_dump({"name": "w", "defaults": {"model": "local:tiny-test", "train": {"steps": 20}},
                                 "axes": {"seed": {"field": "seed", "prefix": "s", "values": list(range(n))}}}))
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
    monkeypatch.setattr(provenance, "pip_freeze", lambda: ["lorarl==0"])
    monkeypatch.setattr(provenance, "git_info", lambda: {"sha": "x", "dirty": False, "diff": "", "untracked": []})
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
    # left: s4's 10 steps + 6 unstarted x 20 (the failed cell is not counted) = 130 steps x 0.5 s, 1 in parallel
    assert s["steps_left"] == 130 and s["eta_s"] == 65.0 and not s["ended"]
    text = render(s)
    assert "12 cells: 4 done, 1 running, 1 failed, 6 not started" in text and "ETA 1m05s" in text
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
    assert len(lines) == 5 and max(map(len, lines)) < 160, text
    assert "1000 cells: 334 done" in text and "adv_std_spike 334 cells (first s0@10)" in text
