"""A cell trained to a rung and later to its end equals a cell trained in one go (lorarl.train.until): the
rung job (the train stage with the job parameter ``until``, its ``--until``, which hands the trainer the rung as its ``stop_at``) pauses
the cell's run there: checkpoint kept (whatever train.checkpoint_every), the rung's snapshot saved, nothing
published, the MLflow run tagged ``lorarl.state=paused``, and the stage writes the rung mark last; the resumed
job retrains no step. The same for a fixed pack (the pack stage): every member pauses at the rung (no step past
it), its mark staged, and comes back bit for bit."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml

from lorarl.train import checkpoint
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.train.until import mark_path, staged_mark_path
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study

STEPS, RUNG = 4, 2


@pytest.fixture(scope="module")
def teacher(tiny_dir, tmp_path_factory):
    """A perturbed copy of the tiny model: a distillation teacher gives dense, varied rewards, so the adapter
    moves and the resumed run must reproduce the sampling exactly (tests/train/test_resume.py does the same)."""
    from tests.support.trained import perturbed_teacher

    return str(perturbed_teacher(tiny_dir, tmp_path_factory.mktemp("teacher")))


def rung_job(cells, results, target=None, until=RUNG):
    """What the train/pack stage of a job gets (lorarl.pipeline.jobs.stages.Job); ``until``: its --until (None: to the end).
    A pack job's id is the plan's (its --pack-id), its rung in it."""
    from lorarl.pack.plan import pack_id

    by_id = {c.id: c for c in cells}
    pid = pack_id(target.split(","), until=until) if target else None
    return SimpleNamespace(cell=lambda: cells[0], target=target, table=SimpleNamespace(cell=by_id.__getitem__),
                           results_dir=results, study=SimpleNamespace(name="ut"), threads=1,
                           params=JobParams(until=until, pack_id=pid))


def study(tmp_path, tiny_dir, teacher, kls=(0.0,)):
    doc = tiny_study("ut", model=str(tiny_dir), reward={"regime": "distillation", "teacher": teacher}, **IN_PROCESS,
                     train={**IN_PROCESS_TRAIN, "steps": STEPS,
                            "checkpoint_every": 3},  # not a divisor of the rung: the rung job saves there anyway
                     eval={"eval_every": RUNG},
                     axes={"kl": {"field": "train.beta", "prefix": "kl", "values": list(kls)}})
    p = tmp_path / "ut.yaml"
    p.write_text(yaml.safe_dump(doc))
    from lorarl.language.study import cell_table, load_study

    return list(cell_table(load_study(str(p))).cells)


def weights(d):
    from safetensors.torch import load_file

    return load_file(str(d / "adapter" / "adapter_model.safetensors"))


def numbers(d):
    rows = pd.read_csv(d / "metrics.csv")
    return rows[[c for c in rows.columns if not c.startswith(("time/", "step_time", "tokens_per_s", "pack/"))]]


def test_train_to_a_rung_then_to_the_end_equals_one_go(tiny_dir, teacher, tmp_path, monkeypatch):
    import mlflow

    from lorarl.pipeline.jobs.stages import get_stage
    from lorarl.train.main import train_cell

    [cell] = study(tmp_path, tiny_dir, teacher)
    one, seg = tmp_path / "one", tmp_path / "seg"
    train_cell("ut", cell, one, threads=1)
    stage = get_stage("train").run

    mark = stage(rung_job([cell], seg))
    cdir = seg / "ut" / cell.id
    assert mark == json.loads(mark_path(seg, "ut", cell.id, RUNG).read_text())
    assert mark["state"] == "at_rung" and not mark["ended"] and mark["config_hash"] == cell.hash
    assert mark["paused_at_step"] == RUNG and (seg / "ut" / ".checkpoints" / cell.id / "paused.json").exists()
    assert not (cdir / "summary.json").exists() and not (cdir / "adapter").exists()  # nothing published
    assert (cdir / "snapshots" / f"step-{RUNG}" / "adapter_config.json").exists()  # the rung's snapshot
    ckpts = checkpoint.complete_checkpoints(seg / "ut" / ".checkpoints" / cell.id)
    assert [c.step for c in ckpts] == [RUNG]  # kept, though checkpoint_every is 3
    client = mlflow.MlflowClient(f"sqlite:///{seg}/mlflow.db")
    run = client.get_run(mark["mlflow_run_id"])
    assert run.data.tags["lorarl.state"] == "paused" and run.data.tags["lorarl.paused_at_step"] == str(RUNG)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == [1, 2]
    again = stage(rung_job([cell], seg))  # a rerun of the rung job (a kill after the save): trains nothing
    assert again["ended"] is False and [c.step for c in checkpoint.complete_checkpoints(ckpts[0].path.parent)] == [RUNG]

    summary = stage(rung_job([cell], seg, until=None))  # a promotion (or search=off): resumes at the rung
    assert summary["resumed_from_steps"] == [RUNG] and summary["mlflow_run_id"] == mark["mlflow_run_id"]
    core = ["step", "reward", "reward_std", "loss", "grad_norm", "entropy", "learning_rate", "num_tokens"]  # test_resume
    pd.testing.assert_frame_equal(numbers(cdir)[core], numbers(one / "ut" / cell.id)[core], rtol=1e-5, atol=1e-6)
    assert numbers(cdir)["step"].tolist() == list(range(1, STEPS + 1))  # every step once: none retrained
    w, ref = weights(cdir), weights(one / "ut" / cell.id)
    assert max(float(v.abs().max()) for k, v in ref.items() if "lora_B" in k) > 1e-4  # it did learn
    assert w.keys() == ref.keys() and all(torch.allclose(w[k], ref[k], rtol=1e-5, atol=1e-6) for k in w)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward")) == list(range(1, STEPS + 1))
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert client.get_run(run.info.run_id).data.tags["lorarl.state"] == "done"
    assert "lorarl.paused_at_step" not in client.get_run(run.info.run_id).data.tags  # finished: no longer paused

    # a late job of the kept cell (a lost launcher's, started after the rerun finished the cell; its checkpoints are
    # gone): its outputs are in place, so it trains nothing and the summary stays the one resumed from the rung
    runs = len(client.search_runs([run.info.experiment_id]))
    assert stage(rung_job([cell], seg, until=None)) == summary == json.loads((cdir / "summary.json").read_text())
    assert len(client.search_runs([run.info.experiment_id])) == runs  # no new MLflow run

    # a finished cell asked for its rung: a mark, no training
    assert stage(rung_job([cell], seg))["ended"] is True
    assert json.loads((cdir / "summary.json").read_text()) == summary


def test_a_fixed_pack_stops_every_member_at_the_rung(tiny_dir, teacher, tmp_path, monkeypatch):
    from lorarl.pack import run as packrun
    from lorarl.pipeline.jobs.stages import get_stage

    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    cells = study(tmp_path, tiny_dir, teacher, kls=(0.0, 0.05))
    one, seg = tmp_path / "one", tmp_path / "seg"
    packrun.train_pack("ut", cells, one, pack_id="pack-0000000000")

    out = get_stage("pack").run(rung_job(cells, seg, target=",".join(c.id for c in cells)))
    assert out["trained"] == [] and out["states"] == {c.id: "paused" for c in cells}
    for c in cells:
        staged = json.loads(staged_mark_path(seg, "ut", c.id, RUNG).read_text())
        assert staged["state"] == "at_rung" and staged["ended"] is False
        assert staged["mlflow_run_id"] == out["outcomes"][c.id]["mlflow_run_id"]
        assert not mark_path(seg, "ut", c.id, RUNG).exists()  # the member's own rung job moves it into place
        [ck] = checkpoint.complete_checkpoints(seg / "ut" / ".checkpoints" / c.id)
        assert ck.step == RUNG and [r["step"] for r in ck.rows] == [1, 2]  # no member trained a step past it
    assert packrun.train_pack("ut", cells, seg, pack_id="pack-0000000000")["trained"] == sorted(c.id for c in cells)
    for c in cells:
        got, want = seg / "ut" / c.id / ".packed", one / "ut" / c.id / ".packed"
        assert json.loads((got / "summary.json").read_text())["resumed_from_steps"] == [RUNG]
        pd.testing.assert_frame_equal(numbers(got), numbers(want))  # bit for bit, like a pack of fresh members
        w, ref = weights(got), weights(want)
        assert all(torch.equal(w[k], ref[k]) for k in ref)
    from lorarl.pack import publish

    c = cells[0]  # published by its own train job; then a late pack-of-one job of it (the pack host) trains nothing
    assert publish.publish(seg, "ut", c.id, c.hash)
    done = json.loads((seg / "ut" / c.id / "summary.json").read_text())
    assert packrun.train_alone("ut", c, seg) == done and done["resumed_from_steps"] == [RUNG]


def test_a_cell_that_ends_before_its_rung_publishes_and_fills_the_rungs_snapshot(tiny_dir, teacher, tmp_path,
                                                                                    monkeypatch):
    """Diverged at step 1, asked for rung 2: its outputs are published as always, the snapshots it never reached
    are its final policy (the rung can be evaluated), its checkpoints go, and the mark says it ended."""
    from lorarl.pipeline.jobs.stages import get_stage
    from lorarl.numerics.divergence import FAULT_ENV

    [cell] = study(tmp_path, tiny_dir, teacher)
    monkeypatch.setenv(FAULT_ENV, "nan_reward_at_step:1")
    mark = get_stage("train").run(rung_job([cell], tmp_path))
    cdir = tmp_path / "ut" / cell.id
    summary = json.loads((cdir / "summary.json").read_text())
    assert summary["state"] == "diverged" and summary["diverged_at_step"] == 1
    assert mark == json.loads(mark_path(tmp_path, "ut", cell.id, RUNG).read_text())
    assert mark["ended"] is True and mark["state"] == "diverged" and mark["mlflow_run_id"] == summary["mlflow_run_id"]
    assert [p.name for p in (cdir / "snapshots").iterdir()] == [f"step-{RUNG}"]  # the final step: the adapter
    assert not (tmp_path / "ut" / ".checkpoints" / cell.id).exists()


@pytest.mark.parametrize("raw", ["0", "x", "-3"])
def test_a_bad_until_is_refused(raw, capsys):
    from lorarl.cli import main

    with pytest.raises(SystemExit) as exit_:  # before anything is submitted or written
        main(["launch", "train", "study.yaml", "c", f"--until={raw}"])
    assert exit_.value.code == 2 and f"--until {raw!r}: allowed: a whole number >= 1" in capsys.readouterr().err


def test_a_members_rung_job_moves_its_packs_staged_mark_into_place(tmp_path):
    """The launcher's side (lorarl.pipeline.jobs.rung_jobs): a pack left the member's mark staged; the member's own
    rung job moves it into place (its one output) instead of training; without one it trains."""
    from types import SimpleNamespace

    from lorarl.pipeline.jobs import inflight
    from lorarl.pipeline.jobs.rung_jobs import handed_over
    from lorarl.train.until import write_mark

    cell = SimpleNamespace(id="r1-s0", hash="abc")
    job = JobParams(until=RUNG)
    assert inflight.missing_outputs("train", str(tmp_path), "ut", "r1-s0", "abc", job) == [str(mark_path(tmp_path, "ut", "r1-s0", RUNG))]
    assert not handed_over(tmp_path, "ut", "r1-s0", "abc", RUNG)  # nothing staged: the job trains the cell itself
    write_mark(tmp_path, "ut", cell, RUNG, staged=True, ended=False, state="at_rung")
    assert not handed_over(tmp_path, "ut", "r1-s0", "other", RUNG)  # a mark of another config is not this job's
    assert handed_over(tmp_path, "ut", "r1-s0", "abc", RUNG)
    assert not staged_mark_path(tmp_path, "ut", "r1-s0", RUNG).exists()
    assert inflight.missing_outputs("train", str(tmp_path), "ut", "r1-s0", "abc", job) == []
