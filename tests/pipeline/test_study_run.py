"""MLflow as the study's home, with the real sqlite store: one parent run per study (made once even by
concurrent cell jobs, kept by resumed and restarted cells), every cell and base run nested under it
(`mlflow.parentRunId`), superseded runs as before, and the aggregate's outputs as the parent's artifacts."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow

from lorarl.badstudies import VALID
from lorarl.language.study import parse_study
from lorarl.tracking import client as tracking
from lorarl.tracking.client import PARENT_TAG, STUDY_RUN_TAG, SUPERSEDED_TAG, Tracker
from lorarl.pipeline.studyrun.study_run import publish
from tests.support.tracking import run_writers


def _runs(client, exp_id: str, view: str = "ACTIVE_ONLY"):
    from mlflow.entities import ViewType

    return client.search_runs([exp_id], run_view_type=getattr(ViewType, view))


def test_concurrent_cells_nest_under_one_study_run(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != tracking.TRACKING_ENV}
    reports = run_writers(3, tmp_path, "conc", steps=2, env={**env, tracking.TRACKING_ENV: "sqlite"})
    client = mlflow.MlflowClient(tracking.resolve_tracking("sqlite", tmp_path))
    runs = _runs(client, client.get_experiment_by_name("conc").experiment_id, "ALL")
    parents = [r for r in runs if r.data.tags.get(STUDY_RUN_TAG) == "true"]
    assert len(parents) == 1 and parents[0].info.lifecycle_stage == "active"  # three jobs raced, one parent
    cells = [r for r in runs if tracking.CELL_TAG in r.data.tags]
    assert sorted(r.info.run_id for r in cells) == sorted(rep["run_id"] for rep in reports)
    assert {r.data.tags[PARENT_TAG] for r in cells} == {parents[0].info.run_id}


def test_restarts_resumes_and_bases_keep_the_parent_and_aggregate_fills_it(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    study = parse_study(VALID, "study.yaml")
    t = Tracker(tmp_path, study.name)
    first = t.start("r1-s0", "r1-s0", {}, {})
    t.finish()
    again = Tracker(tmp_path, study.name)  # a requeued job, a rerun from scratch: a new process
    second = again.start("r1-s0", "r1-s0", {}, {})
    base = again.start("base-tiny", "base-tiny", {"lorarl.base": "true"}, {})
    parent = t.parent_id
    assert again.parent_id == parent and Tracker(tmp_path, study.name).study_run() == parent
    c = t.client
    old, new, b = c.get_run(first), c.get_run(second), c.get_run(base)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags[SUPERSEDED_TAG] == "true"  # superseded as before
    assert old.data.tags[PARENT_TAG] == new.data.tags[PARENT_TAG] == b.data.tags[PARENT_TAG] == parent
    assert [r.info.run_id for r in _runs(c, t.experiment_id) if STUDY_RUN_TAG in r.data.tags] == [parent]

    sdir = tmp_path / study.name
    (sdir / "tables").mkdir(parents=True)
    (sdir / "figures").mkdir()
    (sdir / "report.html").write_text("<html>first</html>")
    (sdir / "tables" / "summary.csv").write_text("cell,reward\nr1-s0,0.5\n")
    (sdir / "figures" / "rank.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert publish(study, tmp_path) == parent
    (sdir / "report.html").write_text("<html>second</html>")  # the aggregate ran again
    assert publish(study, tmp_path) == parent
    run = c.get_run(parent)
    assert run.data.tags["lorarl.study"] == "bad" and run.data.tags["git.sha"]
    assert run.data.tags["lorarl.axes"] == '{"rank": ["r1", "r2"], "seed": ["s0", "s1"]}'
    listed = {f.path for f in c.list_artifacts(parent)} | {f.path for d in ("tables", "figures")
                                                           for f in c.list_artifacts(parent, d)}
    assert listed == {"report.html", "tables", "figures", "tables/summary.csv", "figures/rank.png"}
    got = Path(mlflow.artifacts.download_artifacts(run_id=parent, artifact_path="report.html",
                                                   dst_path=str(tmp_path / "dl"), tracking_uri=t.uri))
    assert got.read_text() == "<html>second</html>"  # the parent shows the latest aggregate


def test_no_store_yet_means_nothing_to_publish(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    assert publish(parse_study(VALID, "study.yaml"), tmp_path) is None
    assert not (tmp_path / "mlflow.db").exists()
