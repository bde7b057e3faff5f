"""Slurm's preemption signal (USR2) reaching a pack job (lorarl.pack.run, lorarl.train.preemption): the pack stops as
a whole. Every member still running checkpoints at the end of its step (one without ``train.checkpoint_every`` too),
every member that leaves the pack at or before that step (its last step, a collapse) is staged as usual, then
submitit's requeue runs ONCE (also when every member ended at that step but a resident job has cells waiting: no
next pack is formed); the requeued job resumes the members that were running and each ends equal to its
uninterrupted run (adapter and metrics to 1e-6, every step once). Whichever member came first, whether it keeps
checkpoints and whether it is still in the pack does not matter. It used to: the pack followed its first member's
signal and stop only, so a signal after that member left (or at its last step) staged the others' runs, cut at
that step, as finished; and a first member without checkpoints caught no signal for the pack at all."""

from __future__ import annotations

import json
import signal

import pytest

from tests.support.pause import outputs
from tests.support.preemption import fake_submitit, signal_before_call
from tests.support.resident import assert_equal_runs, published
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study

CASES = {  # name: (axes, host, steps before: (cell, stop_at), signal before the process's n-th loop step,
    #          {cell: the step it checkpoints at for the requeue}, cells staged before the requeue)
    # the first member has no checkpoints and is at its last step; two members of 4 steps, one without checkpoints
    "resident-first-at-its-last-step": ({"length": {"field": "train.steps", "prefix": "s", "values": [2, 4]},
                                         "every": {"field": "train.checkpoint_every", "prefix": "k", "values": [0, 2]}},
                                        "resident", [], 2, {"s4-k0": 2, "s4-k2": 2}, ["s2-k0", "s2-k2"]),
    "first-collapsed": ({"stop": {"field": "train.stop_on_collapse", "prefix": "c", "values": [True, False]}},
                        "pack", [], 3, {"cFalse": 3}, ["cTrue"]),
    # one place: the signal at the member's last step, a cell still waiting: no further segment, the requeue trains it
    "resident-cells-waiting": ({"length": {"field": "train.steps", "prefix": "s", "values": [2, 4]}},
                               "resident-1", [], 2, {}, ["s2"]),
}


def study_cells(tmp_path, tiny_dir, axes):
    from lorarl.language.study import cell_table, load_study

    doc = tiny_study("rz", model=str(tiny_dir), **IN_PROCESS, eval=None, axes=axes,
                     train={**IN_PROCESS_TRAIN, "steps": 4, "checkpoint_every": 1, "kl_monitor_every": 2})
    return list(cell_table(load_study(str(write_study(tmp_path / "rz.yaml", doc)))).cells)


@pytest.mark.parametrize("name", list(CASES))
def test_a_preempted_pack_checkpoints_every_running_member_then_requeues_once(name, tiny_dir, tmp_path, fake_rewards,
                                                                               monkeypatch):
    from lorarl.pack.resident import train_resident
    from lorarl.pack.run import train_alone, train_pack
    from lorarl.train import checkpoint, flags

    axes, host, before, call, stops, left = CASES[name]
    monkeypatch.setitem(flags.RULES, "test_collapse", lambda rows: 2 if len(list(rows)) >= 2 else None)
    cells = study_cells(tmp_path, tiny_dir, axes)
    ref, res = tmp_path / "ref", tmp_path / "res"
    want = {c.id: train_alone("rz", c, ref) for c in cells}  # each cell's uninterrupted run (a pack of one)
    by = {c.id: c for c in cells}
    for cid, at in before:
        assert train_pack("rz", [by[cid]], res, pack_id="pack-before", stop_at=at)["states"] == {cid: "paused"}

    def job():
        if host.startswith("resident"):
            places = int(host.split("-")[1]) if "-" in host else len(cells)
            return train_resident("rz", cells, res, places=places, resident_id="pack-r")
        return train_pack("rz", cells, res, pack_id="pack-p")

    requeue, previous = fake_submitit()
    try:
        signal_before_call(monkeypatch, call)
        with pytest.raises(SystemExit):
            job()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert requeue.calls == [signal.SIGUSR2]  # one requeue for the whole pack
    for c in cells:
        staged = (res / "rz" / c.id / ".packed" / "summary.json").exists()
        assert staged == (c.id in left), (c.id, staged)
        ckpts = [k.step for k in checkpoint.complete_checkpoints(res / "rz" / ".checkpoints" / c.id)]
        if c.id in stops:  # still running at the signal: checkpointed at its own step, nothing staged
            assert ckpts == [stops[c.id]], (c.id, ckpts)
    again = job()  # the requeued job (the signal was sent once)
    assert again["trained"] == sorted(c.id for c in cells if c.id not in left) and set(again["left_out"]) == set(left)
    published(res, cells)
    for c in cells:
        got = outputs(res / "rz" / c.id)
        assert_equal_runs(got, outputs(ref / "rz" / c.id), resumed_from=None, steps=want[c.id]["steps"])
        if c.id in stops:
            assert got[2]["resumed_from_steps"][-1] == stops[c.id]
        assert json.loads((res / "rz" / c.id / "summary.json").read_text())["state"] == "done"

