"""A cell that leaves a pack at one step and comes back in another pack equals its run in one pack."""

from __future__ import annotations

import torch

from tests.support.pack_steps import clean, fake_regimes, trained


STEPS, LEAVE = 4, 2


def _index(pack, name):
    return [m.name for m in pack.loop.members].index(name)


def run_until(pack, name, step, log):
    """Step ``pack`` until member ``name`` is at ``step``; append its (row, token ids) of each step to ``log``."""
    k = _index(pack, name)
    while pack.loop.members[k].step < step:
        rows = pack.loop.step()
        assert rows, f"{name} stopped at step {pack.loop.members[k].step}"
        if name in rows:
            log.append((clean(rows[name]), pack.loop.last_rollouts[name]))


def _member(pack, name):
    from lorarl.pack.run import Member

    k = _index(pack, name)
    return Member(cell=None, run=None, trained=pack.loop.trainer.cells[k], stream=pack.loop.members[k])


def leave(pack, name, folder):
    """What the pack job writes for a member at a checkpoint: its engine state and its monitors."""
    member = _member(pack, name)
    member.write_state(folder)
    return member.monitors()


def come_back(pack, name, folder, monitors):
    """What the pack job does for a resumed member (lorarl.pack.run.Member.load_state) at its new position."""
    from lorarl.train.cellrun import Resume

    member = _member(pack, name)
    member.load_state(Resume(path=str(folder), step=LEAVE, monitors=monitors, state="running", diverged_at=None))
    return member.stream.step


def build(cells, tmp_path, door=None):
    from lorarl.pack.build import build_pack

    return fake_regimes(build_pack(cells, results_dir=tmp_path, device="cpu", door=door))


def assert_leaves_and_comes_back_equal(x, first_mates, second_mates, first_at, second_at, tmp_path):
    """``x`` in a pack with ``first_mates`` (at position ``first_at``) until LEAVE, then in a pack with
    ``second_mates`` (at ``second_at``) until STEPS = ``x`` alone for STEPS steps."""
    solo = build([x], tmp_path)
    alone = []
    run_until(solo, x.id, STEPS, alone)
    from lorarl.pack.build import Door

    door = Door()  # as a resident job: the second pack reuses the first's base, reference and data
    first = build(first_mates[:first_at] + [x] + first_mates[first_at:], tmp_path, door)
    moved = []
    run_until(first, x.id, LEAVE, moved)
    monitors = leave(first, x.id, tmp_path / "state")
    assert monitors["adv_std_peak"] > 0  # a monitor worth carrying (the rows' adv/std_peak depend on it)
    del first
    second = build(second_mates[:second_at] + [x] + second_mates[second_at:], tmp_path, door)
    assert door.loads == 1  # the base was loaded once for both packs
    assert come_back(second, x.id, tmp_path / "state", monitors) == LEAVE
    run_until(second, x.id, STEPS, moved)
    assert len(moved) == len(alone) == STEPS
    for i, ((row, ids), (row0, ids0)) in enumerate(zip(moved, alone)):
        assert ids == ids0, (x.id, i + 1)  # the same rollout token ids at every step
        assert row.keys() == row0.keys(), (x.id, i + 1)
        bad = {m: (row[m], row0[m]) for m in row if abs(row[m] - row0[m]) > 1e-6}
        assert not bad, (x.id, i + 1, bad)
    k = _index(second, x.id)
    mine, ref = trained(second, k), trained(solo, 0)
    assert mine.keys() == ref.keys()
    assert max(float((mine[n] - ref[n]).abs().max()) for n in mine) <= 1e-6
    assert any(float(ref[n].abs().max()) > 0 for n in ref if "lora_B" in n)  # it trained
    m, s = second.loop.members[k], solo.loop.members[0]
    assert torch.equal(m.sampler.get_state(), s.sampler.get_state())  # no draw more, none fewer
    assert m.order.state_dict()["perm"] == s.order.state_dict()["perm"] and m.order.pos == s.order.pos
    for j, mate in enumerate(second.loop.members):
        if j != k:
            assert mate.step == STEPS - LEAVE  # the pack-mates of the second pack started from step 0 beside it
