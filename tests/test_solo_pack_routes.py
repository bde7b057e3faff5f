"""One cell, one result, across hosts (docs/packed.md, "One cell, one result"): a cell stopped mid-way in one host
and finished in another that the hosting plan allows (lorarl.pack.hosting) equals the same cell trained in one go by
the solo job (TRL's GRPOTrainer): identical sampled token ids at every step, every metric and the final adapter
within 1e-6 in float32 on the CPU. tests/test_solo_pack.py holds the uninterrupted hosts (solo = pack of one = a
member of any pack, under runtime knobs); here each route pauses (a rung's ``stop_at``) or is killed after a
checkpoint and resumes elsewhere: a pack -> packs of one, -> the same pack in another order, a resident pack -> a
fixed pack, a killed pack -> a resident pack, rung segments 1 -> 3 -> end in a pack; and the resident ``places``
knob (1, 2, all; members paused at a freed place and admitted later beside fresh ones) moves no result. A host
whose engine cannot resume a cell's state is refused before anything runs (the plan routes the cell to the host
that can), never switched to silently."""

from __future__ import annotations

import pytest

from tests.support.routes import record_packs
from tests.support.solo_pack import assert_same_result, train_solo
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study

ROUTES = {  # name: the jobs in turn, each (host, members, stop_at); every cell ends equal to its solo TRL run
    "pack-rung-then-packs-of-one": [("pack", "ab", 2), ("alone", "a", None), ("alone", "b", None)],
    "pack-rung-then-the-pack-swapped": [("pack", "ab", 2), ("pack", "ba", None)],
    "resident-rung-then-a-fixed-pack": [("resident-1", "ab", 2), ("pack", "ab", None)],
    "pack-killed-after-a-checkpoint-then-resident": [("pack-killed", "ab", 2), ("resident-2", "ba", None)],
    "rung-segments-1-3-end-in-a-pack": [("pack", "ab", 1), ("pack", "ab", 3), ("pack", "ab", None)],
}
PLACES = (1, 2, 4)  # a resident job over s2-r2, s4-r2, s2-r8, s4-r8 (places 2: s4-r2 pauses at 2, comes back at 2 beside
# a fresh s2-r8); 4: all at once


@pytest.fixture(scope="module")
def study(tiny_dir, tmp_path_factory):
    """Cells of two lengths (2, 4) and two ranks (2, 8), beta > 0, checkpoints every 2 steps; each one's solo run."""
    from lorarl.spec.study import cell_table, load_study

    tmp = tmp_path_factory.mktemp("routes")
    doc = tiny_study("rt", model=str(tiny_dir), **IN_PROCESS, eval=None,
                     reward={"regime": "outcome", "answer_format": "last_number"},
                     train={**IN_PROCESS_TRAIN, "steps": 4, "beta": 0.05, "lr_scheduler": "linear",
                            "checkpoint_every": 2},
                     axes={"length": {"field": "train.steps", "prefix": "s", "values": [2, 4]},
                           "rank": {"field": "adapter.rank", "prefix": "r", "values": [2, 8]}})
    cells = {c.id: c for c in cell_table(load_study(str(write_study(tmp / "rt.yaml", doc)))).cells}
    return cells, {cid: train_solo(c.config, tmp / "solo") for cid, c in cells.items()}


def run_job(host, cells, res, stop_at, monkeypatch):
    from lorarl.pack import run as packrun
    from lorarl.pack.resident import train_resident

    if host == "alone":
        return packrun.train_alone("rt", cells[0], res, stop_at=stop_at)
    if host.startswith("resident"):
        return train_resident("rt", cells, res, places=int(host.split("-")[1]), resident_id="pack-r", stop_at=stop_at)
    if host == "pack-killed":  # killed once every member's step-`stop_at` checkpoint is complete
        real, done = packrun._checkpoint, []

        def kill_after(member, force, pause=False):
            out = real(member, force, pause)
            done.append(member.stream.step)
            if done.count(stop_at) == len(cells):
                raise KeyboardInterrupt("killed after the checkpoints")
            return out

        with monkeypatch.context() as m:
            m.setattr(packrun, "_checkpoint", kill_after)
            with pytest.raises(KeyboardInterrupt):
                packrun.train_pack("rt", cells, res, pack_id="pack-k")
        return None
    return packrun.train_pack("rt", cells, res, pack_id=f"pack-{len(cells)}", stop_at=stop_at)


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_cell_resumed_on_another_host_equals_its_solo_run(route, study, tmp_path, monkeypatch):
    cells, solo = study
    names = {"a": "s4-r2", "b": "s4-r8"}
    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    seen = record_packs(monkeypatch)
    for host, members, stop_at in ROUTES[route]:
        run_job(host, [cells[names[k]] for k in members], tmp_path, stop_at, monkeypatch)
    for cid in names.values():
        assert_same_result(solo[cid], seen.run(cid), tol=1e-6)


def test_resident_places_never_move_a_result(study, tmp_path, monkeypatch):
    from lorarl.pack.resident import train_resident

    cells, solo = study
    order = [cells[k] for k in ("s2-r2", "s4-r2", "s2-r8", "s4-r8")]
    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    for places in PLACES:
        with monkeypatch.context() as m:
            seen = record_packs(m)
            out = train_resident("rt", order, tmp_path / f"p{places}", places=places, resident_id="pack-r")
        assert out["trained"] == sorted(cells) and out["segments"] == {1: 4, 2: 3, 4: 1}[places]
        for c in order:
            assert_same_result(solo[c.id], seen.run(c.id), tol=1e-6)
