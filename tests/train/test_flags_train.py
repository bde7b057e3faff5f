"""Collapse flags on a real (short, CPU) training run: the flags in summary.json are those of
metrics.csv, they reach MLflow as tags, and `train.stop_on_collapse` ends the cell at the first flag
(the planned snapshots after it are the stopped policy, so the evaluations still find them)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lorarl.train import flags
from lorarl.language.study import parse_study, study_cells
from tests.support.study import TRAIN, seeds, tiny_study

pytestmark = pytest.mark.slow

STUDY = tiny_study("fl",
                   train={**TRAIN, "steps": 10, "max_completion_length": 12, "checkpoint_every": 0,
                          "kl_monitor_every": 0, "stop_on_collapse": True},
                   eval={"max_new_tokens": 8, "eval_every": 4}, axes=seeds(0))


def test_stop_on_collapse_in_a_real_run(tmp_path, tiny_test_base):
    import mlflow

    from lorarl.train.main import train_cell
    from tests.support.trained import place_base

    place_base(tiny_test_base, tmp_path)
    # the tiny untrained-for-RL model never stops within a 12-token budget: every completion is
    # truncated, so truncation_saturation fires after TRUNC_RUN steps, and the cell must stop right there
    cell = study_cells(parse_study(STUDY))[0]
    summary = train_cell("fl", cell, tmp_path, threads=1)
    d = tmp_path / "fl" / cell.id
    rows = pd.read_csv(d / "metrics.csv")
    stop = summary["stopped_on_collapse"]
    assert summary["flags"] == {"truncation_saturation": 1} and stop == flags.TRUNC_RUN
    assert int(rows["step"].max()) == stop < STUDY["defaults"]["train"]["steps"]
    records = rows.to_dict("records")
    assert flags.detect(records) == summary["flags"]  # reproducible from the file
    assert flags.detect(records[: stop - 1]) == {}  # not detectable one step earlier: stopped at the first flag
    assert json.loads((d / "summary.json").read_text())["flags"] == summary["flags"]
    assert (d / "snapshots" / "step-4").exists() and (d / "snapshots" / "step-8").exists()  # after the stop: filled
    run = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"])
    assert run.data.tags["flag.truncation_saturation"] == "1" and run.data.tags["lorarl.train.flags"] == "truncation_saturation"
    assert "grad_norm" in rows and rows["grad_norm"].notna().all()  # paper 003's gradient norm is recorded
