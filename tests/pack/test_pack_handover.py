"""The hand-over of a packed member (lorarl.pack.handover): one state file per member, planned -> claimed -> staged ->
published (or released), every wait of the member's train job bounded and said once, stale states of a killed holder
said once; the races of the claim files it replaced (a member reaching its hand-over before its pack's launcher, a
member reading a half-written state) stay covered. No training: each test takes well under a second once torch is
imported (the left-out test imports lorarl.pack.run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lorarl.pack import handover
from lorarl.pack.handover import HandOver


def _stage(results: Path, cell: str, config_hash: str) -> None:
    """A pack job's staging of the member's outputs (lorarl.pack.handover.stage, as the pack's cell runs call it)."""
    work = results / "work"
    (work / "adapter").mkdir(parents=True)
    for name in ("cell.json", "metrics.csv"):
        (work / name).write_text("{}")
    (work / "summary.json").write_text(json.dumps({"config_hash": config_hash}))
    handover.stage(work, results / "st" / cell)


def _gone_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that ran on this host and is gone: a killed holder
    return gone.pid


def _waiter(ho: HandOver, results: Path, config_hash: str = "h1", step: int | None = None):
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(ho.take(results, "st", "c1", config_hash, step, poll_s=0.01)))
    t.start()
    return t, done


def test_states_move_planned_claimed_staged_published(tmp_path, capsys):
    """Snakemake plans, the launcher claims, the job stages, the member's train job publishes: each state written
    whole (JSON, one rename), read in one place; the outputs land in place, summary.json of this config."""
    ho = HandOver.of(tmp_path, "st", "c1")
    assert ho.read() is None and ho.plan("pack-x") and ho.read().state == "planned"
    assert ho.claim("pack-x").state == "claimed" and ho.read().pid == ho.read().pid
    _stage(tmp_path, "c1", "h1")
    st = ho.read()
    assert (st.state, st.pack) == ("staged", "pack-x")
    assert ho.take(tmp_path, "st", "c1", "h1", poll_s=0.01) is True
    assert ho.read().state == "published" and not ho.held()
    assert json.loads((tmp_path / "st" / "c1" / "summary.json").read_text())["config_hash"] == "h1"
    assert "train c1: trained in its pack; outputs moved into place" in capsys.readouterr().out
    left = {p.name for p in (tmp_path / "st" / "c1").iterdir()}
    assert ".handover.json" in left and ".packed" not in left and not [n for n in left if n.endswith(".tmp")]
    for text in ("", "garbage", json.dumps({"state": "other", "pack": "p", "pid": 1, "host": "h", "at": 0})):
        ho.path.write_text(text)  # not a state: no pack holds the member
        assert ho.read() is None and not ho.held()


def test_a_planned_member_waits_for_its_launcher_then_its_pack(tmp_path, capsys):
    """The race of a member's train job that reaches its hand-over before its pack's launcher: Snakemake's planned
    state holds it; the launcher's claim replaces it; the launcher's end (released) lets it go on to train."""
    ho = HandOver.of(tmp_path, "st", "c1")
    ho.plan("pack-x")  # this process stands for Snakemake
    t, done = _waiter(ho, tmp_path)
    t.join(0.3)
    assert t.is_alive()  # no launcher yet: it waits
    ho.claim("pack-x")  # the pack's launcher starts (here: the same process)
    assert not ho.plan("pack-x") and ho.read().state == "claimed"  # a live holder's state is kept
    t.join(0.3)
    assert t.is_alive()
    assert not ho.release("pack-other", "not mine") and ho.release("pack-x", "its pack's launcher ended")
    t.join(5)
    out = capsys.readouterr().out
    assert done == [False]
    assert "waiting for its pack pack-x: planned, its launcher not started yet (at most 300 s)" in out
    assert out.count("its pack is training it (pack-x)") == 1  # each wait said once
    assert "its pack pack-x ended without staging it for this config (its pack's launcher ended); training it here" \
        in out
    assert ho.take(tmp_path, "st", "c1", "h1", poll_s=0.01) is False  # a later run: an earlier release says nothing
    assert capsys.readouterr().out == ""


def test_a_planned_state_whose_launcher_never_starts_is_waited_for_a_bounded_time(tmp_path, monkeypatch, capsys):
    ho = HandOver.of(tmp_path, "st", "c1")
    ho.plan("pack-x")
    monkeypatch.setenv(handover.PENDING_ENV, "0.3")
    t0 = time.monotonic()
    assert ho.take(tmp_path, "st", "c1", "h1", poll_s=0.01) is False  # trains it itself
    assert 0.3 <= time.monotonic() - t0 < 10
    assert ("train c1: its pack pack-x did not claim it in 0.3 s (its launcher never started: see "
            ".packs/pack-x.log); training it here") in capsys.readouterr().out


def test_a_member_staged_before_its_pack_ends_is_published_at_once(tmp_path):
    """Its pack still runs (claimed, holder alive): a member staged for this config is published at once; a waiter
    for another config keeps waiting until the pack releases the member."""
    ho = HandOver.of(tmp_path, "st", "c1")
    ho.claim("pack-x")
    _stage(tmp_path, "c1", "h1")
    ho.claim("pack-x")  # a held state with this config's outputs staged: the outputs decide, not the state
    assert ho.take(tmp_path, "st", "c1", "h1", poll_s=0.01) is True and ho.read().state == "published"
    ho.claim("pack-x")
    t, done = _waiter(ho, tmp_path, "h2")
    t.join(0.3)
    assert t.is_alive()  # nothing of h2 staged: it waits for the pack
    ho.release("pack-x", "its pack's launcher ended")
    t.join(5)
    assert done == [False]


def test_a_rung_job_waits_for_its_staged_mark_then_moves_it(tmp_path):
    """A member that ended before its rung (its summary staged) is not done for its rung job until the pack staged
    the rung mark (at the pack job's end): then outputs and mark are moved into place."""
    from lorarl.train.until import mark_path, staged_mark_path

    ho = HandOver.of(tmp_path, "st", "c1")
    ho.claim("pack-x")
    _stage(tmp_path, "c1", "h1")
    ho.claim("pack-x")
    t, done = _waiter(ho, tmp_path, step=2)
    t.join(0.3)
    assert t.is_alive()  # outputs staged, the mark not yet
    staged = staged_mark_path(tmp_path, "st", "c1", 2)
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_text(json.dumps({"config_hash": "h1", "step": 2}))
    t.join(5)
    assert done == [True] and mark_path(tmp_path, "st", "c1", 2).exists() and not staged.exists()
    assert (tmp_path / "st" / "c1" / "summary.json").exists() and ho.read().state == "published"


@pytest.mark.parametrize("state", ["planned", "claimed"])
def test_a_killed_holders_state_is_said_once_and_cleared(tmp_path, capsys, state):
    """A launcher (or Snakemake) killed leaves its state: the member that finds it says so once and marks it released
    (a second reader says nothing); the next `snakemake` (onstart: clear_stale) removes such states with a line each,
    keeping a live holder's and another host's."""
    pid = _gone_pid()
    ho = HandOver.of(tmp_path, "st", "c1")
    ho.path.parent.mkdir(parents=True)
    doc = {"state": state, "pack": "pack-x", "pid": pid, "host": socket.gethostname(), "at": time.time(), "reason": ""}
    ho.path.write_text(json.dumps(doc))
    assert not ho.held()
    assert ho.take(tmp_path, "st", "c1", "h1", poll_s=0.01) is False  # not held: trains it itself
    assert ho.take(tmp_path, "st", "c1", "h1", poll_s=0.01) is False
    out = capsys.readouterr().out
    said = f"train c1: ignoring the stale hand-over of pack pack-x ({state}; holder process {pid} is gone)"
    assert out.count(said) == 1
    assert ho.read().state == "released"
    ho.path.write_text(json.dumps(doc))
    live, other = HandOver.of(tmp_path, "st", "c2"), HandOver.of(tmp_path, "st", "c3")
    live.claim("pack-y")
    other.path.parent.mkdir(parents=True)
    other.path.write_text(json.dumps({**doc, "host": "another-host"}))
    assert other.held()  # another host's holder cannot be checked: it holds while its state does
    assert handover.clear_stale(tmp_path, "st", ["c1", "c2", "c3", "c4"]) == [ho.path]
    assert not ho.path.exists() and live.held() and other.path.exists()
    assert f"st/c1: removed a stale pack hand-over (pack-x, {state}; holder process {pid} is gone)" in \
        capsys.readouterr().err


def test_another_hosts_claim_holds_while_its_launcher_beats_and_is_stale_once_silent(tmp_path, capsys, monkeypatch):
    """A holder on another host cannot be checked from here: its launcher's heartbeat touches the state file every
    BEAT_S, and a member waits while it is touched; untouched for SILENT_S, the state is stale (said once, released),
    and the next `snakemake` removes such a state. A launcher's heartbeat stops when it releases its members."""
    monkeypatch.setattr(handover, "SILENT_S", 0.5)
    ho = HandOver.of(tmp_path, "st", "c1")
    ho.path.parent.mkdir(parents=True)
    doc = {"state": "claimed", "pack": "pack-x", "pid": 1, "host": "another-host", "at": time.time(), "reason": ""}
    ho.path.write_text(json.dumps(doc))
    t, done = _waiter(ho, tmp_path)
    for _ in range(8):  # its launcher beats: the member keeps waiting
        time.sleep(0.1)
        ho.beat()
    assert t.is_alive() and not done
    t.join(timeout=10)  # no more beats: stale after SILENT_S
    assert done == [False] and ho.read().state == "released"
    out = capsys.readouterr().out
    assert out.count("ignoring the stale hand-over of pack pack-x (claimed on host another-host, not touched for") == 1
    assert "(on host another-host: while it touches the state, at most 0.5 s apart)" in out
    ho.path.write_text(json.dumps(doc))
    os.utime(ho.path, (time.time() - 5, time.time() - 5))
    assert handover.clear_stale(tmp_path, "st", ["c1"]) == [ho.path]
    assert "its holder on another-host silent for over 0.5 s" in capsys.readouterr().err
    monkeypatch.setattr(handover, "BEAT_S", 0.05)
    [mine] = handover.claim_members(tmp_path, "st", ["c2"], "pack-y")
    os.utime(mine.path, (time.time() - 60, time.time() - 60))
    time.sleep(0.3)
    assert mine.silent_s() < 1 and mine.heartbeat.thread.is_alive()  # touched by the launcher's heartbeat
    handover.release_members([mine], "pack-y", "its pack's launcher ended")
    assert not mine.heartbeat.thread.is_alive() and mine.read().state == "released"


def test_a_member_its_pack_leaves_out_is_released_at_once(tmp_path):
    """The pack job leaves out a member finished since the plan (lorarl.pack.run.claim_members): its hand-over is
    released then, so its own train job does not wait for the pack's end; another pack's state is not touched."""
    from types import SimpleNamespace

    from lorarl.pack.run import claim_members

    cells = [SimpleNamespace(id=c, hash="h1") for c in ("c1", "c2")]
    for c in cells:
        (tmp_path / "st" / c.id).mkdir(parents=True)
        (tmp_path / "st" / c.id / "summary.json").write_text(json.dumps({"config_hash": "h1"}))
    HandOver.of(tmp_path, "st", "c1").claim("pack-x")
    HandOver.of(tmp_path, "st", "c2").claim("pack-y")
    members, left_out = claim_members("st", cells, tmp_path, "pack-x", time.time(), None)
    assert members == [] and set(left_out) == {"c1", "c2"}
    st = HandOver.of(tmp_path, "st", "c1").read()
    assert (st.state, st.reason) == ("released", "left out of its pack: finished (or staged) already")
    assert HandOver.of(tmp_path, "st", "c2").read().state == "claimed"
    # a launcher's end releases only the members it holds itself (a later launcher of the same pack keeps its own)
    [mine] = handover.claim_members(tmp_path, "st", ["c3"], "pack-z")
    later = HandOver.of(tmp_path, "st", "c4")
    later.path.parent.mkdir(parents=True)
    later.path.write_text(json.dumps({**json.loads(mine.path.read_text()), "pid": os.getppid()}))  # alive, not us
    handover.release_members([mine, later], "pack-z", "its pack's launcher ended")
    assert mine.read().state == "released" and later.read().state == "claimed"


def test_a_pack_job_takes_its_id_from_the_plan(tmp_path, capsys):
    """The pack stage's id is its `--pack-id` (the hosting plan's, passed by workflow/rules/pack.smk): missing or
    malformed, it is refused naming the field and the allowed form; `lorarl launch pack` without it exits 2 before
    anything is written."""
    import argparse

    from lorarl import cli
    from lorarl.pipeline.jobs import jobparams

    demo = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"
    assert cli.main(["launch", "pack", str(demo), "r1-kl0-s0,r1-kl0-s1", "--results", str(tmp_path / "r")]) == 2
    assert "pack_id missing: a pack job needs --pack-id" in capsys.readouterr().err and not (tmp_path / "r").exists()

    parser = argparse.ArgumentParser()
    jobparams.add_arguments(parser)
    assert jobparams.from_args(parser.parse_args(["--pack-id=pack-0123456789"])).require_pack_id() == "pack-0123456789"
    with pytest.raises(ValueError, match="pack_id missing.*--pack-id=pack-<10 hex digits>"):
        jobparams.JobParams().require_pack_id()
    with pytest.raises(ValueError, match="allowed: pack-<10 hex digits>"):
        jobparams.JobParams(pack_id="pack-xyz")
    with pytest.raises(SystemExit):
        parser.parse_args(["--pack-id=pack-xyz"])
