"""A cell's run paused at a step (``stop_at``, lorarl.train.cellrun) and resumed in another job equals its
uninterrupted run, whatever hosts it:

* the pack engine: two members of ranks 8 and 1 paused at step 2 in one pack job (full state saved, nothing
  staged, MLflow runs ended ``lorarl.state=paused``); the rank-8 member comes back at another position of another
  pack job, beside a rank-2 member starting from scratch; the rank-1 member comes back in its own ``train`` job
  (the stage sees a pack engine's state: a pack of one, published in place). Each ends equal to its uninterrupted solo run (a one-cell job): adapter and
  metrics to 1e-6, every step once in its one MLflow run;
* the solo (TRL) engine: paused at step 2 without ``checkpoint_every``, left out by a pack (its own job resumes
  it), resumed: equal to the uninterrupted run, ``adv/std_peak`` included (the trainer's monitor state travels in
  the checkpoint's mark); each job starts its grading workers and waits for them before its first step, outside
  the step's time (``time/startup_s`` on the job's first row), so the resumed cell's step times are the
  uninterrupted one's: with each job's start-up made at least 1 s long (tests/jobstart.py: far above a loaded
  machine's noise), each job's first step within the cell's median step plus max(that median, 0.5 s)
  (docs/report.md#step-time);
  the same cell in a pack logs every metric the solo run logged, under the same names.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.support.jobstart import assert_no_one_off_step, new_job, slow_start, startup_steps
from tests.support.pause import mlflow_steps, outputs
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study


def study_cells(tmp_path, tiny_dir, ranks=(8, 1, 2), **train):
    from lorarl.language.study import cell_table, load_study

    doc = tiny_study("pz", model=str(tiny_dir), **IN_PROCESS, eval=None,
                     train={**IN_PROCESS_TRAIN, "steps": 4, "checkpoint_every": 0, "kl_monitor_every": 2, **train},
                     axes={"rank": {"field": "adapter.rank", "prefix": "r", "values": list(ranks)}})
    p = write_study(tmp_path / "pz.yaml", doc)
    return {c.id: c for c in cell_table(load_study(str(p))).cells}


def assert_equal_runs(got, want, resumed_from):
    (w, m, s), (w0, m0, s0) = got, want
    assert w.keys() == w0.keys() and max(float((w[k] - w0[k]).abs().max()) for k in w) <= 1e-6
    assert any(float(w0[k].abs().max()) > 0 for k in w0 if "lora_B" in k)  # it trained
    assert list(m.columns) == list(m0.columns) and list(m["step"]) == [1, 2, 3, 4]  # every step once
    pd.testing.assert_frame_equal(m, m0, rtol=0, atol=1e-6)
    assert "adv/std_peak" in m and m["adv/std_peak"].iloc[-1] > 0
    assert s["resumed_from_steps"] == resumed_from and s["state"] == "done" and s["steps"] == 4


def test_pack_members_pause_and_come_back_elsewhere_equal_to_their_solo_runs(tiny_dir, tmp_path, fake_rewards):
    from lorarl.pack import publish
    from lorarl.pack.run import train_alone, train_pack
    from lorarl.pipeline.jobs.jobparams import JobParams
    from lorarl.pipeline.jobs.stages import get_stage
    from lorarl.train import cellstate

    cells = study_cells(tmp_path, tiny_dir)
    x, y, z = cells["r8"], cells["r1"], cells["r2"]
    ref, res = tmp_path / "ref", tmp_path / "res"
    for c in (x, y):  # the uninterrupted solo runs: a one-cell job each
        assert train_alone("pz", c, ref)["state"] == "done"

    paused = train_pack("pz", [x, y], res, pack_id="pack-first", stop_at=2)
    assert paused["trained"] == [] and paused["states"] == {"r8": "paused", "r1": "paused"}
    runs = {}
    for c in (x, y):
        root = res / "pz" / ".checkpoints" / c.id
        mark = json.loads((root / cellstate.PAUSED).read_text())
        assert mark["paused_at_step"] == 2 and (root / "checkpoint-2" / cellstate.ENGINE_FILE).exists()
        assert not (res / "pz" / c.id / "summary.json").exists() and publish.unfinished(res, "pz", c.id, c.hash)
        runs[c.id] = mark["mlflow_run_id"]
        steps, run = mlflow_steps(res, runs[c.id])
        assert steps == [1, 2] and run.data.tags["lorarl.state"] == "paused"
        assert cellstate.waiting_engine(res, "pz", c) == "pack"

    again = train_pack("pz", [z, x], res, pack_id="pack-second")  # x at position 1, beside rank 2 from scratch
    assert again["trained"] == ["r2", "r8"] and again["left_out"] == {}
    assert publish.publish(res, "pz", x.id, x.hash)  # its own train job moves the staged outputs into place
    job = SimpleNamespace(cell=lambda: y, results_dir=res, study=SimpleNamespace(name="pz"), threads=None,
                          params=JobParams())  # no --until: to the end
    alone = get_stage("train").run(job)  # y's own train job: a pack engine's state goes on as a pack of one
    assert alone["state"] == "done" and alone["mlflow_run_id"] == runs["r1"]
    for c in (x, y):
        assert_equal_runs(outputs(res / "pz" / c.id), outputs(ref / "pz" / c.id), resumed_from=[2])
        steps, run = mlflow_steps(res, runs[c.id])
        assert steps == [1, 2, 3, 4] and run.data.tags["lorarl.state"] == "done"  # one run, each step once
        assert not (res / "pz" / ".checkpoints" / c.id).exists()
        assert startup_steps(pd.read_csv(res / "pz" / c.id / "metrics.csv")) == [1, 3]  # each pack job's start-up


def test_a_solo_run_pauses_is_left_out_by_packs_and_resumes_equal(tiny_dir, tmp_path, fake_rewards, monkeypatch):
    from lorarl import jobclock
    from lorarl.grading import pool
    from lorarl.pack.run import train_pack
    from lorarl.train import cellstate
    from lorarl.train.main import train_cell

    # Dr. GRPO's unscaled advantages: adv/std peaks at step 1, so a resumed run must carry the peak to log it
    x = study_cells(tmp_path, tiny_dir, ranks=(8,), scale_rewards="none")["r8"]
    ref, res = tmp_path / "ref", tmp_path / "res"
    slow_start(monkeypatch)  # each job's start-up at least jobstart.SLOW_START_S: a step charged with it shows
    new_job(monkeypatch)  # each train_cell below is a job of its own: it starts its grading workers
    train_cell("pz", x, ref, threads=1)
    new_job(monkeypatch)
    paused = train_cell("pz", x, res, threads=1, stop_at=2)
    assert paused["state"] == "paused" and paused["paused_at_step"] == 2
    assert not (res / "pz" / x.id / "summary.json").exists()
    assert cellstate.waiting_engine(res, "pz", x) == "hf"
    out = train_pack("pz", [x], res, pack_id="pack-solo-state")  # its solo checkpoint is kept for its own job
    assert out["trained"] == [] and "solo (TRL) checkpoint" in out["left_out"]["r8"]
    new_job(monkeypatch)
    done = train_cell("pz", x, res, threads=1)
    assert done["mlflow_run_id"] == paused["mlflow_run_id"]
    assert_equal_runs(outputs(res / "pz" / x.id), outputs(ref / "pz" / x.id), resumed_from=[2])
    assert mlflow_steps(res, done["mlflow_run_id"])[0] == [1, 2, 3, 4]
    # step time without one-off costs (docs/report.md#step-time): each job waited for its workers before its first
    # step, so the resumed cell, which paid that twice, has the uninterrupted cell's step times
    want, got = (pd.read_csv(d / "pz" / x.id / "metrics.csv") for d in (ref, res))
    assert startup_steps(want) == [1] and startup_steps(got) == [1, 3] and (got["time/startup_s"].dropna() > 0).all()
    summary = json.loads((res / "pz" / x.id / "summary.json").read_text())
    assert summary["startup_s"] == pytest.approx(got["time/startup_s"].sum(), abs=1e-3)  # both jobs' start-up
    assert "grading pool" in jobclock.startup_s() and pool.wait_started() == 0.0  # a ready pool costs nothing more
    assert_no_one_off_step(want, [1])
    assert_no_one_off_step(got, [1, 3])
    # every metric the solo job logs, a packed member logs under the same name (ppo_kl, entropy, clip_ratio/*,
    # completions/*, num_tokens, ...); a resident member's columns equal its pack's (tests/pack/test_resident.py)
    from lorarl.pack.run import train_alone

    assert train_alone("pz", x, tmp_path / "packed")["state"] == "done"
    solo_cols = set(pd.read_csv(ref / "pz" / x.id / "metrics.csv").columns)
    packed = pd.read_csv(tmp_path / "packed" / "pz" / x.id / "metrics.csv")
    assert {"ppo_kl", "entropy", "clip_ratio/high_max", "num_tokens"} <= solo_cols
    assert solo_cols - set(packed.columns) == set()
    assert packed["num_tokens"].is_monotonic_increasing and packed["ppo_kl"].notna().all()
