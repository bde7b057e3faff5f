"""One cell, one result, across hosts (docs/packed.md, "One cell, one result"): a cell stopped mid-way in one host
and finished in another that the hosting plan allows (lorarl.pack.hosting) equals the same cell trained in one go by
the solo job (TRL's GRPOTrainer): identical sampled token ids at every step, every metric and the final adapter
within 1e-6 in float32 on the CPU. tests/pack/test_solo_pack.py holds the uninterrupted hosts (solo = pack of one = a
member of any pack, under runtime knobs); here two cells (ranks 2 and 8, beta > 0) go through every hand-over in one
chain of jobs (ROUTE: rung segments in a fixed pack and a resident pack, a pack killed after a checkpoint, other
positions, packs of one), and a resident job's ``places`` (1, 2, all; a member paused at a freed place comes back
beside a fresh one, at another step) moves no result. A host whose engine cannot resume a cell's state is refused
before anything runs (WrongHost, lorarl.train.cellrun); the plan routes the cell to the host that can."""

from __future__ import annotations

import pytest

from tests.support.routes import record_packs
from tests.support.solo_pack import assert_same_result, train_solo
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study

ROUTE = [  # (host, members in order, the step the job stops at: a rung's stop_at, the checkpoint a kill follows)
    ("pack", "ab", 1),  # a rung segment in a fixed pack
    ("resident-1", "ba", 2),  # -> a resident job of one place, other order: a rung segment each
    ("pack-killed", "ba", 4),  # -> a fixed pack, killed once both step-4 checkpoints are complete (steps 3, 4 kept)
    ("resident-2", "ab", 5),  # -> a resident pack of two places: a rung segment
    ("alone", "a", None), ("alone", "b", None),  # -> each a pack of one in its own train job, to its end (6)
]
PLACES = {1: 3, 2: 2, 3: 1}  # places -> the resident job's segments over s2-r2, s6-r2, s6-r8 (places 2: s6-r2 pauses
# at 2 when s2-r2 ends, and comes back at step 2 beside a fresh s6-r8)


@pytest.fixture(scope="module")
def study(tiny_dir, tmp_path_factory):
    """Cells s2-r2, s6-r2, s6-r8 (steps x rank; beta > 0, checkpoints every 2 steps) and each one's solo TRL run."""
    from lorarl.language.study import cell_table, load_study

    tmp = tmp_path_factory.mktemp("routes")
    doc = tiny_study("rt", model=str(tiny_dir), **IN_PROCESS, eval=None,
                     reward={"regime": "outcome", "answer_format": "last_number"},
                     train={**IN_PROCESS_TRAIN, "steps": 6, "beta": 0.05, "lr_scheduler": "linear",
                            "checkpoint_every": 2},
                     axes={"length": {"field": "train.steps", "prefix": "s", "values": [2, 6]},
                           "rank": {"field": "adapter.rank", "prefix": "r", "values": [2, 8]}})
    cells = {c.id: c for c in cell_table(load_study(str(write_study(tmp / "rt.yaml", doc)))).cells if c.id != "s2-r8"}
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
    return packrun.train_pack("rt", cells, res, pack_id="pack-p", stop_at=stop_at)


def test_a_cell_handed_over_between_hosts_equals_its_solo_run(study, tmp_path, monkeypatch):
    """Each hand-over of ROUTE; a pack engine's state is refused by the solo (TRL) trainer and planned ``alone``."""
    from lorarl.pack.hosting import solo_host
    from lorarl.train.cellrun import WrongHost
    from lorarl.train.checkpoint import complete_checkpoints
    from lorarl.train.main import train_cell

    cells, solo = study
    names = {"a": "s6-r2", "b": "s6-r8"}
    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    seen = record_packs(monkeypatch)
    for k, (host, members, stop_at) in enumerate(ROUTE):
        run_job(host, [cells[names[m]] for m in members], tmp_path, stop_at, monkeypatch)
        if k == 0:  # the pack engine's state: TRL cannot resume it, so the plan hosts the cell alone
            a = cells[names["a"]]
            root = tmp_path / "rt" / ".checkpoints" / a.id
            assert solo_host(tmp_path, "rt", a).kind == "alone"
            with pytest.raises(WrongHost, match="pack engine's state"):
                train_cell("rt", a, tmp_path, threads=1)
            assert [c.step for c in complete_checkpoints(root)] == [1] and (root / "paused.json").exists()
    for cid in names.values():
        assert_same_result(solo[cid], seen.run(cid), tol=1e-6)  # ids every step, metrics, adapter


def test_a_solo_state_is_refused_by_a_pack_engine_and_planned_solo(study, tmp_path, monkeypatch):
    from lorarl.pack.hosting import solo_host
    from lorarl.pack.run import train_alone, train_pack
    from lorarl.train.cellrun import WrongHost
    from lorarl.train.main import train_cell

    cells, _ = study
    c = cells["s2-r2"]
    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    assert train_cell("rt", c, tmp_path, threads=1, stop_at=1)["state"] == "paused"
    assert solo_host(tmp_path, "rt", c).kind == "solo"
    with pytest.raises(WrongHost, match="hf engine's state"):
        train_alone("rt", c, tmp_path)
    assert "solo (TRL) checkpoint" in train_pack("rt", [c], tmp_path, pack_id="pack-x")["left_out"][c.id]


def test_resident_places_never_move_a_result(study, tmp_path, monkeypatch):
    from lorarl.pack.resident import train_resident

    cells, solo = study
    order = [cells[k] for k in ("s2-r2", "s6-r2", "s6-r8")]
    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")
    for places, segments in PLACES.items():
        with monkeypatch.context() as m:
            seen = record_packs(m)
            out = train_resident("rt", order, tmp_path / f"p{places}", places=places, resident_id="pack-r")
        assert out["trained"] == sorted(cells) and out["segments"] == segments
        for c in order:
            assert_same_result(solo[c.id], seen.run(c.id), tol=1e-6)
