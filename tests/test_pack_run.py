"""The pack job (lorarl.pack.run) and its hand-over to the members' train jobs (lorarl.pack.publish):
each member's normal outputs, its own MLflow run, per-cell checkpoint/resume (an interrupted pack
resumes bit for bit), staged outputs published with summary.json last."""

from __future__ import annotations

import json
import os

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
    from lorarl.spec.study import cell_table, load_study

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


def test_claims_are_alive_only_while_their_launcher_runs(tmp_path):
    from lorarl.pack import publish

    (p,) = publish.claim(tmp_path, "st", ["c1"], "pack-x")
    assert publish.claim_alive(p)
    host = p.read_text().split()[1]
    p.write_text(f"999999999 {host} pack-x\n")  # a launcher that died: its claim is ignored
    assert not publish.claim_alive(p)
    (p,) = publish.claim(tmp_path, "st", ["c1"], "pack-x")
    publish.unclaim([p])
    assert not p.exists()
    os.environ.pop(publish.GRACE_ENV, None)


def test_a_killed_holders_claim_is_said_and_removed_at_the_next_start(tmp_path, capsys):
    """A pack launcher (or Snakemake) killed leaves its `.pack.claim`: a member's launcher ignores it with a line, and
    the next `snakemake` removes it at its start (onstart: clear_stale_claims), one line per claim; a live claim, and
    another host's, stay."""
    import socket
    import subprocess
    import sys

    from lorarl.pack import publish

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that ran on this host and is gone: a killed holder
    dead = publish.claim_path(tmp_path, "st", "c1")
    dead.parent.mkdir(parents=True)
    dead.write_text(f"{gone.pid} {socket.gethostname()} pack-x\n")
    (live,) = publish.claim(tmp_path, "st", ["c2"], "pack-y")
    other = publish.claim_path(tmp_path, "st", "c3")
    other.parent.mkdir(parents=True)
    other.write_text(f"{gone.pid} another-host pack-z\n")
    assert publish.wait_and_publish(tmp_path, "st", "c1", "h1", 0.01) is False  # not held: trains it itself
    assert f"train c1: ignoring the stale claim of pack pack-x (holder process {gone.pid} is gone)" in \
        capsys.readouterr().out
    assert publish.clear_stale_claims(tmp_path, "st", ["c1", "c2", "c3", "c4"]) == [dead]
    assert not dead.exists() and live.exists() and other.exists()
    assert f"st/c1: removed a stale pack claim (pack-x, holder process {gone.pid} is gone)" in capsys.readouterr().err
    publish.unclaim([live])


def test_a_pending_claim_holds_a_member_until_its_pack_launcher_claims_and_ends(tmp_path, monkeypatch, capsys):
    """Snakemake's onstart claim (pending, in its own name) keeps a member's train job waiting for a pack launcher
    that starts after it; the launcher's own claim replaces it, and its end lets the member go on."""
    import threading

    from lorarl.pack import publish

    monkeypatch.setenv(publish.PENDING_ENV, "60")
    (p,) = publish.claim_pending(tmp_path, "st", ["c1"], "pack-x")  # this process stands for Snakemake
    assert publish.claim_alive(p) and publish.is_pending(p)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(publish.wait_and_publish(tmp_path, "st", "c1", "h1", 0.01)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # no launcher yet: it waits
    (q,) = publish.claim(tmp_path, "st", ["c1"], "pack-x")  # the pack's launcher starts (here: the same process)
    assert q == p and not publish.is_pending(p)
    assert publish.claim_pending(tmp_path, "st", ["c1"], "pack-x") == []  # a live launcher's claim is kept
    assert not publish.is_pending(p)
    waiter.join(0.3)
    assert waiter.is_alive()
    publish.unclaim([q])
    waiter.join(5)
    assert done == [False] and "its pack is training it (pack-x); waiting" in capsys.readouterr().out


def test_a_pending_claim_whose_pack_never_starts_is_waited_for_a_bounded_time(tmp_path, monkeypatch, capsys):
    import time

    from lorarl.pack import publish

    (p,) = publish.claim_pending(tmp_path, "st", ["c1"], "pack-x")
    monkeypatch.setenv(publish.PENDING_ENV, "0.3")
    t0 = time.monotonic()
    assert publish.wait_and_publish(tmp_path, "st", "c1", "h1", 0.01) is False  # trains it itself
    assert 0.3 <= time.monotonic() - t0 < 10
    assert "its pack pack-x did not start in 0.3 s; training it here" in capsys.readouterr().out
    host = p.read_text().split()[1]
    p.write_text(f"999999999 {host} pack-x pending\n")  # Snakemake gone: its pending claim is ignored
    assert not publish.claim_alive(p)
    (q,) = publish.claim_pending(tmp_path, "st", ["c1"], "pack-y")  # and replaced by the next run's
    assert publish.claim_alive(q) and q.read_text().split()[2:] == ["pack-y", "pending"]
    for text in ("", "garbage\n", f"{os.getpid()} {host} pack-x other\n", f"{os.getpid()} {host}\n"):
        q.write_text(text)  # not a claim: not alive, not pending
        assert not publish.claim_alive(q) and not publish.is_pending(q)


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


def test_a_member_staged_before_its_pack_ends_is_published_at_once(tmp_path, monkeypatch):
    """Its pack still runs (the claim is alive): a member whose outputs of this config are staged is published
    without waiting for the pack's end; one not staged yet (or staged for another config) keeps waiting."""
    import threading

    from lorarl.pack import publish

    cell = tmp_path / "st" / "c1"
    cell.mkdir(parents=True)
    (p,) = publish.claim(tmp_path, "st", ["c1"], "pack-x")  # this process: alive until unclaimed
    work = tmp_path / "work"
    (work / "adapter").mkdir(parents=True)
    for name in ("cell.json", "metrics.csv"):
        (work / name).write_text("{}")
    (work / "summary.json").write_text(json.dumps({"config_hash": "h1"}))
    publish.stage(work, cell)
    assert publish.wait_and_publish(tmp_path, "st", "c1", "h1", poll_s=0.01) is True
    assert json.loads((cell / "summary.json").read_text())["config_hash"] == "h1" and publish.claim_alive(p)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(publish.wait_and_publish(tmp_path, "st", "c1", "h2", 0.01)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # nothing of h2 staged: it waits for the pack
    publish.unclaim([p])
    waiter.join(5)
    assert done == [False]  # the pack ended without it: the train job trains it itself
