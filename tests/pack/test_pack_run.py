"""The pack job (lorarl.pack.run) and its staged outputs for the members' train jobs (lorarl.pack.publish):
each member's normal outputs, its own MLflow run, per-cell checkpoint/resume (an interrupted pack
resumes bit for bit), staged outputs published with summary.json last."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.support.pack_run import staged
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study


def study_file(tmp_path, tiny_dir, checkpoint_every=2):
    doc = tiny_study("pk", model=str(tiny_dir), **IN_PROCESS, eval=None,
                     train={**IN_PROCESS_TRAIN, "steps": 3, "checkpoint_every": checkpoint_every, "kl_monitor_every": 2},
                     axes={"kl": {"field": "train.beta", "prefix": "kl", "values": [0.0, 0.05]}})
    return write_study(tmp_path / "pk.yaml", doc)


def cells_of(path):
    from lorarl.language.study import cell_table, load_study

    return list(cell_table(load_study(str(path))).cells)


def test_interrupted_pack_resumes_per_cell_bit_for_bit(tiny_dir, tmp_path, monkeypatch):
    import torch

    from lorarl.pack import run as packrun

    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    study = study_file(tmp_path, tiny_dir)
    cells = cells_of(study)
    ref, interrupted = tmp_path / "ref", tmp_path / "int"
    out = packrun.train_pack("pk", cells, ref, pack_id="pack-0000000000")
    assert out["trained"] == sorted(c.id for c in cells)

    real = packrun._checkpoint
    calls = []

    def stop_after_step_2(member, force, pause=False):
        stop = real(member, force, pause)
        calls.append(member.stream.step)
        if member.stream.step == 2 and len(calls) == 2 * len(cells):  # both members checkpointed step 2
            raise KeyboardInterrupt("simulated kill after the step-2 checkpoints")
        return stop

    monkeypatch.setattr(packrun, "_checkpoint", stop_after_step_2)
    with pytest.raises(KeyboardInterrupt):
        packrun.train_pack("pk", cells, interrupted, pack_id="pack-0000000000")
    run_ids = {c.id: json.loads((interrupted / "pk" / ".checkpoints" / c.id / "checkpoint-2" / "lorarl.json")
                                .read_text())["mlflow_run_id"] for c in cells}
    monkeypatch.setattr(packrun, "_checkpoint", real)
    again = packrun.train_pack("pk", cells, interrupted, pack_id="pack-0000000000")
    assert again["trained"] == out["trained"]
    for c in cells:
        w_ref, m_ref, s_ref = staged(ref, c.id)
        w_int, m_int, s_int = staged(interrupted, c.id)
        assert w_ref.keys() == w_int.keys() and all(torch.equal(w_ref[k], w_int[k]) for k in w_ref)  # bit for bit
        pd.testing.assert_frame_equal(m_ref, m_int)
        assert list(m_int["step"]) == [1, 2, 3]  # every step exactly once
        assert s_int["resumed_from_steps"] == [2] and s_int["mlflow_run_id"] == run_ids[c.id]  # same MLflow run
        assert s_int["pack"]["members"] == [x.id for x in cells] and s_int["state"] == "done"
        assert not (interrupted / "pk" / ".checkpoints" / c.id).exists()  # checkpoints dropped once staged
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{interrupted}/mlflow.db")
    for c in cells:  # MLflow: every step exactly once in the cell's one run, across the interruption
        assert [m.step for m in client.get_metric_history(run_ids[c.id], "reward")] == [1, 2, 3]
        live = sorted(m.step for m in client.get_metric_history(run_ids[c.id], "live/reward"))
        assert live == [1, 2, 3]  # shown live, each step once
        tags = client.get_run(run_ids[c.id]).data.tags
        assert tags["lorarl.pack"] == "pack-0000000000" and tags["lorarl.state"] == "done"
        assert "lorarl.killed_attempts" not in tags  # interrupted, its run ended by the process itself: no kill
    assert json.loads((interrupted / "pk" / ".packs" / "pack-0000000000.json").read_text())["left_out"] == {}
    # a second pack job over finished (staged) cells trains nothing
    assert packrun.train_pack("pk", cells, interrupted, pack_id="pack-0000000000")["trained"] == []


def test_publish_moves_staged_outputs_summary_last(tmp_path):
    from lorarl.pack import publish

    cell = tmp_path / "st" / "c1"
    work = cell / ".pack.tmp"
    (work / "adapter").mkdir(parents=True)
    (work / "adapter" / "w").write_text("x")
    for name in ("cell.json", "metrics.csv"):
        (work / name).write_text("{}")
    (work / "summary.json").write_text(json.dumps({"config_hash": "h1"}))
    publish.stage(work, cell)
    assert publish.unfinished(tmp_path, "st", "c1", "h1") is False  # staged counts as finished (never re-packed)
    assert publish.unfinished(tmp_path, "st", "c1", "h2") is True
    assert publish.publish(tmp_path, "st", "c1", "h2") is False  # another config's outputs are not taken
    (cell / "adapter").mkdir()  # a stale output in the way is replaced
    assert publish.publish(tmp_path, "st", "c1", "h1") is True
    assert (cell / "adapter" / "w").read_text() == "x" and json.loads((cell / "summary.json").read_text())
    assert not (cell / ".packed").exists()


def test_residual_init_pack_saves_each_member_as_alone(tiny_dir, tmp_path, monkeypatch):
    """A PiSSA pack job: each member's adapter is saved converted for the ORIGINAL base (as the solo
    trainer saves it) and equals, bit for bit, what a pack of that cell alone saves."""
    import torch

    from lorarl.pack import run as packrun

    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    study = study_file(tmp_path, tiny_dir)
    doc = yaml.safe_load(study.read_text())
    doc["defaults"]["adapter"]["init"] = "pissa"
    study.write_text(yaml.safe_dump(doc))
    cells = cells_of(study)
    packed = packrun.train_pack("pk", cells, tmp_path / "packed", pack_id="pack-0000000001")
    assert packed["trained"] == sorted(c.id for c in cells)
    for c in cells:
        alone = packrun.train_pack("pk", [c], tmp_path / f"alone-{c.id}", pack_id="pack-0000000002")
        assert alone["trained"] == [c.id]
        w_pack, m_pack, _ = staged(tmp_path / "packed", c.id)
        w_alone, m_alone, _ = staged(tmp_path / f"alone-{c.id}", c.id)
        assert w_pack.keys() == w_alone.keys() and all(torch.equal(w_pack[k], w_alone[k]) for k in w_pack), c.id
        pd.testing.assert_frame_equal(m_pack.drop(columns="pack/cells"), m_alone.drop(columns="pack/cells"))
        meta = json.loads((tmp_path / "packed" / "pk" / c.id / ".packed" / "adapter" / "lorarl_adapter.json").read_text())
        assert meta["residual_converted"] is True, meta
