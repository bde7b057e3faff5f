"""runtime.csv (paper 000 Table 2) in training steps: a cell whose step holds 4 optimiser updates (PPO
mini-batches) logs `time/step_s` per update (a metrics row holds the mean of its step's 4), and its rows
count training steps; the report's step time is the whole training step's, so step time x steps is the
cell's training time, not a quarter of it."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from lorarl.report.data import StudyData
from lorarl.report.tables import per_cell_runtime, runtime_table
from lorarl.language.study import parse_study, study_cells
from tests.support.study import seeds, tiny_study

TRAIN = {"steps": 2, "prompts_per_step": 4, "mini_batch_prompts": 1, "generations": 2, "max_completion_length": 6,
         "kl_monitor_every": 0, "log_every": 1}


def _study(model):
    return parse_study(tiny_study("rt", task=None, adapter=None, eval=None, model=model, train=TRAIN, axes=seeds(0)))


def test_runtime_is_per_training_step_with_four_updates_per_step(tiny_dir, tmp_path):
    from tests.support.grpo_knobs import build

    from lorarl.train.callbacks import MetricsRecorder

    study = _study(str(tiny_dir))
    cell = study_cells(study)[0]
    u = cell.config.train.updates_per_step
    assert u == 4
    trainer, _ = build(tiny_dir, tmp_path, cell.config, scores=(1.0, 0.0) * 4)
    rec = MetricsRecorder(tmp_path / "metrics.csv", None, updates_per_step=u)
    trainer.add_callback(rec)
    from lorarl import ledger

    ledger.begin(in_process=True)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    rec.flush()
    # the cost ledger (lorarl.ledger) closes a step window at every update: its phases add up to the updates' time
    cost = ledger.record("train", study="rt", cell=cell.id, outcome="completed", threads=1)
    in_steps = sum(cost["phases_s"].get(p, 0.0) for p in ("generation", "reward", "reference", "update", "handoff"))
    curves = pd.read_csv(tmp_path / "metrics.csv").assign(cell=cell.id)
    assert curves["step"].tolist() == [1, 2] and curves["update"].tolist() == [4, 8]  # rows are training steps
    assert cost["steps"] == 8 and in_steps == pytest.approx(u * curves["time/step_s"].sum(), rel=0.01, abs=0.01)
    assert cost["phases_s"]["generation"] > 0 and cost["phases_s"]["update"] > 0 and cost["phases_s"]["reward"] > 0
    data = StudyData(study, tmp_path, pd.DataFrame({"cell": [cell.id]}), curves, pd.DataFrame(), pd.DataFrame(),
                     pd.DataFrame())
    per = per_cell_runtime(data).loc[cell.id]
    assert per["steps"] == 2
    assert per["step_s"] == pytest.approx(u * curves["time/step_s"].mean())  # a row's time/step_s: one update's
    # the recorder's own step time (on_step_begin → on_step_end summed over the step's 4 updates)
    assert per["step_s"] == pytest.approx(curves["step_time_s"].mean(), rel=0.2)
    assert per["train_min"] * 60 == pytest.approx(per["step_s"] * 2) and per["train_min"] * 60 <= wall
    rt = runtime_table(data)
    assert rt["step_s_mean"].iloc[0] == pytest.approx(per["step_s"])
    assert rt["train_min_mean"].iloc[0] == pytest.approx(per["train_min"])


def test_one_update_per_step_is_unchanged(tmp_path):
    """One update per step: a row's `time/step_s` is the step's time as it stands."""
    study = _study("local:tiny-test")
    study_plain = parse_study(tiny_study("rt", task=None, adapter=None, eval=None,
                                         train={**TRAIN, "mini_batch_prompts": None}, axes=seeds(0)))
    cid = study_cells(study)[0].id
    curves = pd.DataFrame({"step": [1, 2], "time/step_s": [0.5, 1.5], "cell": cid})
    plain = StudyData(study_plain, tmp_path, pd.DataFrame({"cell": [cid]}), curves, pd.DataFrame(),
                      pd.DataFrame(), pd.DataFrame())
    four = StudyData(study, tmp_path, pd.DataFrame({"cell": [cid]}), curves, pd.DataFrame(), pd.DataFrame(),
                     pd.DataFrame())
    assert per_cell_runtime(plain).loc[cid, "step_s"] == pytest.approx(1.0)
    assert per_cell_runtime(four).loc[cid, "step_s"] == pytest.approx(4.0)
    # the recorder's step_time_s (no time/step_s column) is already per training step
    rec = curves.drop(columns="time/step_s").assign(step_time_s=[2.0, 6.0])
    assert per_cell_runtime(StudyData(study, tmp_path, pd.DataFrame({"cell": [cid]}), rec, pd.DataFrame(),
                                      pd.DataFrame(), pd.DataFrame())).loc[cid, "step_s"] == pytest.approx(4.0)
