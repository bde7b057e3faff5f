"""The packer's pack-or-solo rule for vLLM cells (lorarl.pack.breakeven, lorarl.pack.plan.plan_packs): a table of
cases on a made-up table, the split into solo runs with its log line, and the committed measured table (written by
bench/vllm_pack_breakeven.py) read as the packer reads it."""

from __future__ import annotations

import json

import pytest

from tests.support.pack import _cell as pack_cell

# ratio[rank][K] = pack tokens/s / solo tokens/s: small ranks win from K = 2, rank 64 only from K = 4, rank 256 never
TABLE = {"device": "cpu", "machine": "test machine",
         "ratio": {"1": {"1": 0.8, "2": 1.3, "4": 2.1, "8": 3.0}, "8": {"1": 0.7, "2": 1.1, "4": 1.9, "8": 2.5},
                   "64": {"1": 0.5, "2": 0.9, "4": 1.2, "8": 1.6}, "256": {"1": 0.2, "2": 0.4, "4": 0.6, "8": 0.8}}}


@pytest.mark.parametrize("members,rank,packs,cell", [
    (2, 1, True, "K=2, max rank 1"), (2, 8, True, "K=2, max rank 8"), (2, 4, True, "K=2, max rank 8"),
    (2, 64, False, "K=2, max rank 64"), (3, 64, False, "K=2, max rank 64"), (4, 64, True, "K=4, max rank 64"),
    (7, 32, True, "K=4, max rank 64"), (16, 64, True, "K=8, max rank 64"), (8, 256, False, "K=8, max rank 256"),
    (8, 512, False, "K=8, max rank 256 (rank 512 is above the table's largest)")])
def test_the_rule_rounds_rank_up_and_members_down(members, rank, packs, cell):
    from lorarl.pack.breakeven import verdict

    v = verdict(TABLE, members, rank)
    assert v.pack is packs and cell in v.why and "test machine" in v.why, v.why
    assert ("below 1" in v.why) is not packs


def test_a_losing_vllm_pack_is_split_into_solo_runs_saying_why(capsys):
    from lorarl.pack.plan import plan_packs

    def cells(prefix, ranks, **kw):
        return [pack_cell(f"{prefix}{k}", rollout__engine="vllm", adapter__rank=r, **kw) for k, r in enumerate(ranks)]

    hf = [pack_cell(f"h{k}", adapter__rank=256) for k in range(2)]
    low, high = cells("lo", (1, 8)), cells("hi", (8, 64))
    assert plan_packs(low + high + hf, 2, TABLE) == [["lo0", "lo1"], ["hi0"], ["hi1"], ["h0", "h1"]]
    err = capsys.readouterr().err
    assert "[lorarl] pack: declined a vLLM pack of 2 cells (hi0, hi1): measured pack/solo tokens/s 0.90 at K=2" in err
    assert "they train solo" in err and "lo0" not in err  # HF packs are never asked
    assert plan_packs(high, 2, None) == [["hi0", "hi1"]]  # no table: the pack as grouped
    assert plan_packs(cells("w", (8, 64, 64, 1)), 4, TABLE) == [["w0", "w1", "w2", "w3"]]  # 4 at rank 64 win
    pissa = cells("p", (4, 4), adapter__init="pissa")  # handed to vLLM at 2r = 8: packs; at r = 32 (64): solo
    assert plan_packs(pissa, 2, TABLE) == [["p0", "p1"]]
    assert plan_packs(cells("q", (32, 32), adapter__init="pissa"), 2, TABLE) == [["q0"], ["q1"]]


def test_the_committed_table_is_the_measured_one_and_the_host_reads_it(monkeypatch):
    from lorarl.pack import breakeven

    table = breakeven.load_table(breakeven.TABLES["cpu"])
    assert table["device"] == "cpu" and "CPUs" in table["machine"] and table["command"].startswith("bench/")
    assert sorted(map(int, table["ratio"])) == [1, 8, 64, 256]
    assert all(sorted(map(int, row)) == [1, 2, 4, 8] and all(q > 0 for q in row.values())
               for row in table["ratio"].values())
    monkeypatch.setattr(breakeven, "host_device", lambda: "cpu")
    assert breakeven.host_table() == table
    monkeypatch.setattr(breakeven, "host_device", lambda: "gpu")  # no GPU table yet: packs kept
    assert breakeven.host_table() is None


def test_a_file_that_is_not_a_table_is_refused_naming_it(tmp_path):
    from lorarl.pack.breakeven import load_table

    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"ratio": {}}))
    with pytest.raises(ValueError, match="t.json: not a break-even table"):
        load_table(bad)


def test_the_table_decides_by_the_ratio_it_names():
    from lorarl.pack.breakeven import verdict

    both = {**TABLE, "ratio_cpu": {"8": {"2": 0.95}}, "decide": "ratio_cpu"}  # wall says pack, CPU-seconds solo
    v = verdict(both, 2, 8)
    assert not v.pack and "pack/solo tokens/CPU-s 0.95 at K=2, max rank 8" in v.why
    assert verdict(TABLE, 2, 8).pack and "pack/solo tokens/s 1.10" in verdict(TABLE, 2, 8).why


def _vllm(prefix, ranks, **kw):
    return [pack_cell(f"{prefix}{k}", rollout__engine="vllm", adapter__rank=r, **kw) for k, r in enumerate(ranks)]


# a resident job's engine holds min(places, members) adapters at once: the table's K; its group's largest saved rank
@pytest.mark.parametrize("ranks,places,init,kept,cell", [
    ((1, 8, 8), 2, "gaussian", True, "K=2, max rank 8"), ((8, 8, 64), 2, "gaussian", False, "K=2, max rank 64"),
    ((64,) * 5, 4, "gaussian", True, "K=4, max rank 64"), ((64,) * 5, 8, "gaussian", True, "K=4, max rank 64"),
    ((64,) * 3, 8, "gaussian", False, "K=2, max rank 64"), ((64,) * 4, 2, "gaussian", False, "K=2, max rank 64"),
    ((1,) * 4, 1, "gaussian", False, "K=1, max rank 1"), ((4, 4, 4), 2, "pissa", True, "K=2, max rank 8"),
    ((32, 32, 32), 2, "pissa", False, "K=2, max rank 64")])
def test_a_resident_vllm_job_is_asked_at_the_adapters_its_engine_holds(capsys, monkeypatch, ranks, places, init, kept,
                                                                        cell):
    from lorarl.pack import breakeven
    from lorarl.pack.plan import split_losing

    monkeypatch.setattr(breakeven, "_SAID", set())  # each case's line said afresh (a process says a line once)

    cells = _vllm("c", ranks, adapter__init=init)
    ids = [c.id for c in cells]
    got = split_losing([ids], cells, TABLE, places)
    assert got == ([ids] if kept else [[i] for i in ids])
    err = capsys.readouterr().err
    if kept:
        assert "declined" not in err
    else:
        assert (f"[lorarl] pack: declined a resident vLLM job of {len(ids)} cells with {places} places "
                f"({', '.join(ids)}): measured pack/solo tokens/s") in err and cell in err and "they train solo" in err


def test_the_hosting_plan_hosts_a_losing_resident_vllm_jobs_cells_solo(tmp_path, monkeypatch, capsys):
    """Decided in the hosting plan (what pack.smk and the doctor read): a losing resident vLLM job's cells are hosted
    solo, a winning one and an HF one stay resident; the job itself is never asked again."""
    from types import SimpleNamespace

    from lorarl.pack import breakeven
    from lorarl.pack.hosting import Runtime, hosting_plan

    monkeypatch.setattr(breakeven, "host_table", lambda: TABLE)
    monkeypatch.setattr(breakeven, "_SAID", set())
    wins = _vllm("w", (1, 8, 8))  # three groups (their lengths differ): K=2 at rank 8 wins, K=2 at 64 loses
    loses = _vllm("l", (8, 64), train__max_completion_length=32)
    hf = [pack_cell(f"h{k}", adapter__rank=256, train__max_completion_length=64) for k in range(2)]
    cells = wins + loses + hf
    for c in cells:
        c.hash = f"hash-{c.id}"
    study = SimpleNamespace(name="st", kind="grpo", search=None)
    plan = hosting_plan(study, Runtime(places=2), tmp_path, SimpleNamespace(cells=cells))
    assert {c: h.kind for c, h in plan.items()} == {"w0": "resident", "w1": "resident", "w2": "resident",
                                                    "l0": "solo", "l1": "solo", "h0": "resident", "h1": "resident"}
    assert plan["w0"].members == ("w0", "w1", "w2") and plan["h0"].job != plan["w0"].job
    err = capsys.readouterr().err
    assert "declined a resident vLLM job of 2 cells with 2 places (l0, l1): measured pack/solo tokens/s 0.90 at K=2, " \
           "max rank 64" in err and "w0" not in err and "h0" not in err
    fixed = hosting_plan(study, Runtime(max_cells=2), tmp_path, SimpleNamespace(cells=cells))  # plan_packs's own rule
    assert [fixed[c].kind for c in ("w0", "w1", "w2", "l0", "l1")] == ["pack", "pack", "solo", "solo", "solo"]
