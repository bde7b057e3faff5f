"""The study in MLflow (real sqlite stores): every experiment lorarl makes or opens is a model-training one
(`mlflow.experimentKind`; the view the UI opens comes from the link: tests/tracking/test_mlflow_ui.py); the study's
parent run spans the study (first job start to the aggregate's end) and carries its wall time and cell counts,
updated in place by each aggregate of a partial study, and rebuilt the same by `sync-mlflow` into a new store;
beside it, the wall time of the study's last complete run, without the gaps between reruns."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from lorarl.badstudies import VALID
from lorarl.language.study import load_study
from lorarl.tracking import client as tracking
from lorarl.tracking.client import PARENT_TAG, STUDY_RUN_TAG, Tracker
from lorarl.pipeline.studyrun.study_run import publish
from lorarl.pipeline.studyrun.sync import sync_study

KIND = ("mlflow.experimentKind", "custom_model_development")  # the experiment's kind (the UI's kind selector)
NUMBERS = ("study/wall_time_s", "study/cells_total", "study/cells_finished", "study/cells_failed",
           "study/cells_diverged")


def _at(path: Path, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def _finished(res: Path, cell: str, end_ms: int, wall_s: float = 5.0) -> None:
    d = res / "bad" / cell
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"wall_time_s": wall_s, "final_train_reward": 0.5}))
    _at(d / "summary.json", end_ms)


def _aggregated(res: Path, end_ms: int) -> None:
    (res / "bad" / "tables").mkdir(parents=True, exist_ok=True)
    (res / "bad" / "tables" / "summary.csv").write_text("cell,reward\nr1-s0,0.5\n")
    (res / "bad" / "report.html").write_text(f"<html>{end_ms}</html>")
    _at(res / "bad" / "tables" / "summary.csv", end_ms - 10_000)
    _at(res / "bad" / "report.html", end_ms)


def _parents(client, exp_id: str) -> list:
    from mlflow.entities import ViewType

    runs = client.search_runs([exp_id], run_view_type=ViewType.ALL)
    return [r for r in runs if r.data.tags.get(STUDY_RUN_TAG) == "true"]


def _history(client, run_id: str) -> dict[str, list[float]]:
    return {k: [m.value for m in client.get_metric_history(run_id, k)] for k in NUMBERS}


def test_every_experiment_is_a_model_training_one(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    t = Tracker(tmp_path, "fresh")
    c = t.client
    assert c.get_experiment(t.experiment_id).tags[KIND[0]] == KIND[1]
    older = c.create_experiment("older")  # made by an older lorarl: no kind, so the UI opens it as GenAI
    hand = c.create_experiment("hand", tags={KIND[0]: "finetuning"})  # a kind the user chose in the UI
    assert Tracker(tmp_path, "older").experiment_id == older and Tracker(tmp_path, "hand").experiment_id == hand
    assert c.get_experiment(older).tags[KIND[0]] == KIND[1]
    assert c.get_experiment(hand).tags[KIND[0]] == "finetuning"


def test_parent_run_spans_the_study_and_sync_rebuilds_it(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(VALID))
    study = load_study(tmp_path / "study.yaml")  # 4 cells: r1-s0 r1-s1 r2-s0 r2-s1
    res = tmp_path / "results"
    t = Tracker(res, study.name)
    t.start("r1-s0", "r1-s0", {}, {})
    t.finish()
    c, parent = t.client, t.parent_id
    start = c.get_run(parent).info.start_time  # made by the first cell job: the study's first start
    first = (start // 1000 - 30) * 1000  # a job of r1-s1 started before any cell opened the store
    _finished(res, "r1-s0", start + 60_000)
    prov = res / "bad" / "r1-s1" / "provenance" / "train.json"
    prov.parent.mkdir(parents=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(first / 1000))
    prov.write_text(json.dumps({"submissions": [{"executor": "local", "job_id": "999999999", "attempts": [
        {"job_id": "999999999", "started_at": stamp, "ended_at": stamp, "outcome": "failed: OOM"}]}]}))
    (res / "bad" / "r1-s1" / "logs").mkdir()
    (res / "bad" / "r1-s1" / "logs" / "train.log").write_text("[lorarl] error: CUDA out of memory\n")
    _aggregated(res, start + 100_000)

    assert publish(study, res) == parent
    run = c.get_run(parent)
    assert run.info.status == "FINISHED" and run.info.start_time == start
    assert abs(run.info.end_time - (start + 100_000)) <= 1  # the aggregate's end, not 10 ms after the start
    assert run.data.metrics == pytest.approx({"study/wall_time_s": 100.0, "study/cells_total": 4,
                                              "study/cells_finished": 1, "study/cells_failed": 1,
                                              "study/cells_diverged": 0}, abs=2e-3)

    # the study goes on: one more cell, the aggregate again; the same parent, its end and counts move
    _finished(res, "r2-s0", start + 200_000)
    _aggregated(res, start + 250_000)
    assert publish(study, res) == parent
    run = c.get_run(parent)
    assert abs(run.info.end_time - (start + 250_000)) <= 1
    assert run.data.metrics["study/wall_time_s"] == pytest.approx(250.0, abs=2e-3)
    hist = _history(c, parent)
    assert hist["study/cells_finished"] == [1, 2] and hist["study/cells_failed"] == [1]  # changed values only
    assert publish(study, res) == parent and _history(c, parent) == hist  # nothing new: nothing logged
    assert [r.info.run_id for r in _parents(c, t.experiment_id)] == [parent]

    # a new store rebuilt from the files: one parent, starting where the files say, ending the same
    new_uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    monkeypatch.setenv(tracking.TRACKING_ENV, new_uri)
    sync_study(tmp_path / "study.yaml", res)
    new = mlflow.MlflowClient(new_uri)
    exp = new.get_experiment_by_name("bad")
    assert exp.tags[KIND[0]] == KIND[1]
    [rebuilt] = _parents(new, exp.experiment_id)
    assert rebuilt.info.start_time == first and rebuilt.info.end_time == run.info.end_time
    assert rebuilt.data.tags["lorarl.axes"] == run.data.tags["lorarl.axes"]
    wall = (run.info.end_time - first) / 1000  # 280 s and the start's milliseconds
    assert rebuilt.data.metrics == pytest.approx({**run.data.metrics, "study/wall_time_s": wall}, abs=2e-3)
    cells = new.search_runs([exp.experiment_id], "tags.`lorarl.cell_id` != ''")
    assert sorted(r.data.tags["lorarl.cell_id"] for r in cells) == ["r1-s0", "r2-s0"]
    assert {r.data.tags[PARENT_TAG] for r in cells} == {rebuilt.info.run_id}
    again = _history(new, rebuilt.info.run_id)
    sync_study(tmp_path / "study.yaml", res)  # again: the same parent, nothing logged twice
    assert len(_parents(new, exp.experiment_id)) == 1 and _history(new, rebuilt.info.run_id) == again


def _submitted(res: Path, cell: str, invocation: str, at_s: float, took_s: float) -> None:
    """One job of `cell` submitted by the `snakemake` run `invocation` at `at_s`, ending `took_s` later."""
    prov = res / "bad" / cell / "provenance" / "train.json"
    prov.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(prov.read_text()) if prov.exists() else {"submissions": []}
    stamp = lambda s: time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(s))  # noqa: E731
    doc["submissions"].append({"submitted_at": stamp(at_s), "invocation": invocation, "attempts": [
        {"started_at": stamp(at_s + 1), "ended_at": stamp(at_s + took_s), "outcome": "completed"}]})
    prov.write_text(json.dumps(doc))


def test_the_last_complete_run_is_timed_without_the_gaps_between_reruns(tmp_path: Path, monkeypatch):
    """Four cells run in one `snakemake all` (A); four days later one is rerun (B): the parent spans four days,
    `study/last_run_wall_time_s` only B, from its first job's start to the end of its aggregate; an aggregate by
    hand and `sync-mlflow` into a new store give the same number (results/<study>/.last_run.json)."""
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(VALID))
    study = load_study(tmp_path / "study.yaml")
    res = tmp_path / "results"
    t = Tracker(res, study.name)
    t.start("r1-s0", "r1-s0", {}, {})
    t.finish()
    start = t.client.get_run(t.parent_id).info.start_time // 1000  # whole seconds, as provenance stamps
    later = start + 4 * 86_400
    for cell in ("r1-s0", "r1-s1", "r2-s0", "r2-s1"):
        _submitted(res, cell, "host-1-A", start, 60)
        _finished(res, cell, (start + 60) * 1000)
    _aggregated(res, (start + 70) * 1000)  # A's own aggregate (its rule's --invocation), at start + 70 s
    publish(study, res, invocation="host-1-A")
    assert t.client.get_run(t.parent_id).data.metrics["study/last_run_wall_time_s"] == pytest.approx(69.0)  # from the 1st job's start
    _submitted(res, "r2-s1", "host-2-B", later, 30)  # B reruns one cell (started 1 s after its submission)
    _finished(res, "r2-s1", (later + 30) * 1000)
    _aggregated(res, (later + 40) * 1000)
    publish(study, res, invocation="host-2-B")
    metrics = t.client.get_run(t.parent_id).data.metrics
    assert metrics["study/wall_time_s"] > 4 * 86_400 and metrics["study/last_run_wall_time_s"] == pytest.approx(39.0)
    assert json.loads((res / "bad" / ".last_run.json").read_text())["invocation"] == "host-2-B"
    _aggregated(res, (later + 500) * 1000)  # an invocation that only re-aggregates: B stays the last run
    publish(study, res, invocation="host-3-C")
    assert _history(t.client, t.parent_id)["study/cells_total"] == [4]
    assert [m.value for m in t.client.get_metric_history(t.parent_id, "study/last_run_wall_time_s")] == [69.0, 39.0]
    new_uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"  # a new store rebuilt from the files: the same number
    (tmp_path / "new").mkdir()
    monkeypatch.setenv(tracking.TRACKING_ENV, new_uri)
    sync_study(tmp_path / "study.yaml", res)
    new = mlflow.MlflowClient(new_uri)
    [rebuilt] = _parents(new, new.get_experiment_by_name("bad").experiment_id)
    assert rebuilt.data.metrics["study/last_run_wall_time_s"] == pytest.approx(39.0)
    (res / "bad" / ".last_run.json").unlink()  # B's aggregate never recorded: B ends with its last job
    (res / "bad" / "r1-s0" / "summary.json").unlink()  # and a study that is not complete has no last run
    from lorarl.pipeline.studyrun.study_span import last_run

    assert last_run(study, res, 0)["wall_time_s"] == pytest.approx(29.0)
    publish(study, res)  # not complete: the last run's number is not logged again
    assert [m.value for m in new.get_metric_history(rebuilt.info.run_id, "study/last_run_wall_time_s")] == [39.0]
