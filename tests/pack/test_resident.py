"""Resident packs (lorarl.pack.resident): a job with K places admits the next waiting cell when a member finishes,
collapses (``train.stop_on_collapse``) or pauses at its rung (an adaptive study's stop: issue 40), and every cell
ends equal to its solo run (a one-cell pack): per-step metrics and final adapter to 1e-6, each step once in its one
MLflow run. In process, tiny models; the job-level path (a SIGKILLed job, the Snakemake config) is
tests/pack/test_resident_job.py, end to end through Snakemake tests/pack/test_resident_snakemake.py."""

from __future__ import annotations

import json

import pytest


from tests.support.pause import mlflow_steps, outputs
from tests.support.resident import assert_equal_runs, published, resident_cells, solo_runs


@pytest.fixture
def collapses_at_3(monkeypatch):
    """A collapse flag that fires at step 3 of every cell (only cells with stop_on_collapse stop there)."""
    from lorarl.train import flags

    monkeypatch.setitem(flags.RULES, "test_collapse", lambda rows: 3 if len(list(rows)) >= 3 else None)


def test_a_freed_place_takes_the_next_cell_after_a_finish_and_a_collapse(tiny_dir, tmp_path, fake_rewards,
                                                                        collapses_at_3):
    from lorarl.pack.resident import train_resident

    cells = resident_cells(tmp_path, tiny_dir)
    order = [cells[k] for k in sorted(cells, key=lambda k: ("s4-cTrue", "s2-cFalse", "s4-cFalse", "s2-cTrue").index(k))]
    ref, res = tmp_path / "ref", tmp_path / "res"
    solo = solo_runs(ref, order)
    assert solo["s4-cTrue"]["stopped_on_collapse"] == 3
    out = train_resident("rz", order, res, places=2, resident_id="pack-resident")
    ledger = json.loads((res / "rz" / ".packs" / "pack-resident.ledger.json").read_text())["segments"]
    # s2-cFalse finishes at 2: s4-cTrue pauses there, comes back beside s4-cFalse; it collapses at 3: s2-cTrue comes in
    assert [s["admitted"] for s in ledger] == [["s4-cTrue", "s2-cFalse"], ["s4-cTrue", "s4-cFalse"],
                                               ["s4-cFalse", "s2-cTrue"]]
    assert [s["left"] for s in ledger] == [["s2-cFalse"], ["s4-cTrue"], ["s2-cTrue", "s4-cFalse"]]
    assert out["trained"] == sorted(cells) and out["left_out"] == {} and out["segments"] == 3
    assert out["base_loads"] == 1  # three packs, one load of the base (its door: lorarl.pack.build.Door)
    published(res, order)
    resumed = {"s4-cTrue": [2], "s4-cFalse": [1], "s2-cFalse": [], "s2-cTrue": []}
    for c in order:
        n = 3 if c.id == "s4-cTrue" else c.config.train.steps
        got = outputs(res / "rz" / c.id)
        assert_equal_runs(got, outputs(ref / "rz" / c.id), resumed_from=resumed[c.id], steps=n)
        assert got[2]["pack"]["resident"] == 2
        assert mlflow_steps(res, got[2]["mlflow_run_id"])[0] == list(range(1, n + 1))  # one MLflow run, each step once
    assert not (res / "rz" / ".checkpoints").exists() or not any((res / "rz" / ".checkpoints").iterdir())


def test_a_member_paused_at_its_rung_frees_its_place(tiny_dir, tmp_path, fake_rewards):
    """Issue 40 item 4: a member stopped at the adaptive rung (the job's ``stop_at``) leaves for good and its place
    goes to the next waiting cell; the rung-paused cells resume later (any host) equal to their runs in a job of one
    place (places 2 = places 1: metrics and adapter to 1e-6)."""
    from lorarl.pack.resident import train_resident
    from lorarl.train import cellstate

    cells = resident_cells(tmp_path, tiny_dir, steps=(2, 4, 5, 6), collapse=(False,))
    order = [cells[f"s{n}-cFalse"] for n in (2, 4, 5, 6)]
    ref, res = tmp_path / "ref", tmp_path / "res"
    out = train_resident("rz", order, res, places=2, resident_id="pack-rung", stop_at=3)
    segs = [s["admitted"] for s in json.loads((res / "rz" / ".packs" / "pack-rung.ledger.json").read_text())["segments"]]
    # s2 finishes at 2 (s5 takes its place); s4 pauses at its rung 3 while s5 is at step 1: s6 takes s4's place
    assert segs == [["s2-cFalse", "s4-cFalse"], ["s4-cFalse", "s5-cFalse"], ["s5-cFalse", "s6-cFalse"]]
    assert out["states"] == {"s2-cFalse": "done", "s4-cFalse": "paused", "s5-cFalse": "paused", "s6-cFalse": "paused"}
    for x in order[1:]:
        mark = json.loads((res / "rz" / ".checkpoints" / x.id / cellstate.PAUSED).read_text())
        assert mark["paused_at_step"] == 3 and out["outcomes"][x.id]["paused_at_step"] == 3
    again = train_resident("rz", order, res, places=2, resident_id="pack-rest")  # promoted: on to their ends
    assert again["trained"] == ["s4-cFalse", "s5-cFalse", "s6-cFalse"]
    published(res, order)
    one = train_resident("rz", order, ref, places=1, resident_id="pack-one")  # the reference: one place (a runtime
    assert one["segments"] == 4 and one["base_loads"] == 1  # knob), each cell alone in turn (its solo run: test above)
    published(ref, order)
    for x in order:
        got = outputs(res / "rz" / x.id)
        assert_equal_runs(got, outputs(ref / "rz" / x.id), resumed_from=None, steps=x.config.train.steps)
        assert (3 in got[2]["resumed_from_steps"]) == (x is not order[0])  # from its rung


def test_wall_time_ends_at_the_members_own_last_step_on_every_host(tiny_dir, tmp_path, fake_rewards, collapses_at_3,
                                                                   monkeypatch):
    """`wall_time_s` means one thing on every host (docs/packed.md): from the moment a host took the cell to its own
    last step there. A member that stops at 3 beside one that trains to 4 (whose step 4 takes 1.5 s more here)
    ends that much earlier, in a fixed pack as in a resident one; it used to end with its pack."""
    import time

    from lorarl.pack import build
    from lorarl.pack.resident import train_resident
    from lorarl.pack.run import train_pack

    cells = resident_cells(tmp_path, tiny_dir, steps=(4,), collapse=(True, False))
    short, long_ = cells["s4-cTrue"], cells["s4-cFalse"]
    real = build.build_pack  # fake_rewards' fake regimes

    def slow_after_the_short_one(*a, **kw):
        pack = real(*a, **kw)
        step = pack.loop.step

        def step_then_wait():
            rows = step()
            if rows and short.id not in rows:
                time.sleep(1.5)
            return rows

        pack.loop.step = step_then_wait
        return pack

    monkeypatch.setattr(build, "build_pack", slow_after_the_short_one)
    for host in ("fixed", "resident"):
        res = tmp_path / host
        if host == "fixed":
            train_pack("rz", [short, long_], res, pack_id="pack-fixed")
        else:
            train_resident("rz", [short, long_], res, places=2, resident_id="pack-resident")
        s, lg = (json.loads((res / "rz" / c.id / ".packed" / "summary.json").read_text()) for c in (short, long_))
        assert s["stopped_on_collapse"] == 3 and lg["steps"] == 4, host
        assert lg["wall_time_s"] - s["wall_time_s"] >= 1.4, (host, s["wall_time_s"], lg["wall_time_s"])
