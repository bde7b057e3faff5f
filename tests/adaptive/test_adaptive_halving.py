"""Successive halving on hand-built records (lorarl.adaptive.halving.decide): paired seeds, ties, a rung
with missing records, failed cells, promotions (ASHA vs SH), direction, min_kept, and the ledger's
stickiness and idempotence."""

from __future__ import annotations

import itertools
import random

import pytest

from lorarl.adaptive.halving import decide
from lorarl.adaptive.ledger import render
from lorarl.language.adaptive.settings import tie_key
from tests.support.adaptive import grid, recs, spec


def at(ledger: dict, step: int) -> dict[str, str]:
    return next(r for r in ledger["rungs"] if r["step"] == step)["decided"]


def full(values: dict[str, float], step: int = 10) -> dict[str, dict[int, float]]:
    """Both seeds of each rank at ``step``: seed 0 = v - 0.01, seed 1 = v + 0.01 (mean v)."""
    out = {}
    for r, v in values.items():
        out[f"r{r}-s0"] = {step: v - 0.01}
        out[f"r{r}-s1"] = {step: v + 0.01}
    return out


def test_sh_keeps_the_best_half_by_the_mean_over_seeds():
    settings = grid()
    assert [s.name for s in settings] == ["rank=1", "rank=2", "rank=4", "rank=8"]
    assert settings[0].cells == ("r1-s0", "r1-s1")
    # rank 8 has the single best cell (0.9) but the worse mean: a setting is judged as a whole
    table = full({"1": 0.3, "2": 0.5, "4": 0.6}) | {"r8-s0": {10: 0.9}, "r8-s1": {10: 0.05}}
    led = decide(spec(), settings, recs(table))
    assert at(led, 10) == {"rank=1": "stop", "rank=2": "promote", "rank=4": "promote", "rank=8": "stop"}
    rung = led["rungs"][0]
    assert rung["complete"] and rung["keep"] == 2
    assert rung["values"]["rank=8"]["mean"] == pytest.approx(0.475) and rung["values"]["rank=8"]["cells"]["r8-s0"] == 0.9
    assert led["state"]["rank=1"] == {"state": "stopped", "rung": 10}
    assert led["state"]["rank=4"] == {"state": "running", "rung": 20}  # promoted: trains on to rung 20
    # rung 20: rank 4 beats rank 2; the winner trains to the end
    table["r2-s0"][20], table["r2-s1"][20], table["r4-s0"][20], table["r4-s1"][20] = 0.5, 0.5, 0.7, 0.7
    led = decide(spec(), settings, recs(table))
    assert at(led, 20) == {"rank=2": "stop", "rank=4": "promote"}
    assert led["state"]["rank=4"] == {"state": "finishing", "rung": None}
    assert led["state"]["rank=2"] == {"state": "stopped", "rung": 20}


def test_sh_waits_on_a_rung_with_a_missing_record():
    table = full({"1": 0.3, "2": 0.5, "4": 0.6, "8": 0.7})
    del table["r8-s1"]  # one seed of one setting has not recorded rung 10
    led = decide(spec(), grid(), recs(table))
    assert at(led, 10) == {} and not led["rungs"][0]["complete"] and led["decisions"] == []
    assert led["state"]["rank=8"] == {"state": "running", "rung": 10}
    assert led["state"]["rank=4"] == {"state": "waiting", "rung": 10}
    assert led["rungs"][0]["values"]["rank=8"] == {"mean": None, "cells": {"r8-s0": 0.69}}


def test_asha_promotes_as_soon_as_the_best_of_the_first_settings_allow_but_never_the_first_alone():
    table = full({"1": 0.5})
    led = decide(spec(rule="asha"), grid(), recs(table))
    assert at(led, 10) == {}  # one setting in, eta = 2: Optuna would promote it, lorarl waits
    table |= full({"2": 0.1})
    led = decide(spec(rule="asha"), grid(), recs(table))
    assert at(led, 10) == {"rank=1": "promote"}  # best 1 of the first 2
    assert led["state"]["rank=1"] == {"state": "running", "rung": 20}
    table |= full({"8": 0.95})  # rank 4 has not reported: rank 8 waits behind it in the arrival order
    assert at(decide(spec(rule="asha"), grid(), recs(table)), 10) == {"rank=1": "promote"}
    table |= full({"4": 0.9})
    led = decide(spec(rule="asha"), grid(), recs(table))
    # complete: SH would keep ranks 8 and 4; ASHA's early promotion of rank 1 stands (never reversed)
    assert at(led, 10) == {"rank=1": "promote", "rank=2": "stop", "rank=4": "promote", "rank=8": "promote"}
    assert at(decide(spec(), grid(), recs(table)), 10) == {"rank=1": "stop", "rank=2": "stop", "rank=4": "promote",
                                                          "rank=8": "promote"}
    assert led["rungs"][1]["arrival"] == ["rank=1", "rank=4", "rank=8"]  # the order of promotion (prefix 2, 3, 4)


@pytest.mark.parametrize("rule", ["sha", "asha"])
def test_decisions_depend_on_the_records_not_on_when_they_arrived(rule):
    """Records arrive one cell at a time in 30 random orders: every intermediate ledger's decisions are kept
    by every later one (nothing reversed), and the final ledger is the same bytes whatever the order."""
    settings = grid(ranks=("1", "2", "4", "8", "16", "32"), seeds=("0", "1", "2"))
    rng = random.Random(7)
    truth = {(c, step): round(rng.random(), 3) for s in settings for c in s.cells for step in (10, 20)}
    finals = set()
    for _ in range(30):
        order = list(truth)
        rng.shuffle(order)
        got: dict[str, dict[int, float]] = {}
        before: set = set()
        for cell, step in order:
            got.setdefault(cell, {})[step] = truth[(cell, step)]
            led = decide(spec(rule=rule, eta=3), settings, recs(got))
            now = {(d["setting"], d["rung"], d["decision"]) for d in led["decisions"]}
            assert before <= now
            before = now
        finals.add(render(led))
    assert len(finals) == 1


def test_ties_are_broken_by_the_previous_rung_then_by_the_name_hash_never_by_order():
    settings = grid()
    table = full({"1": 0.5, "2": 0.5, "4": 0.5, "8": 0.5})
    led = decide(spec(eta=4), settings, recs(table))  # keep 1 of 4 equal settings
    winner = min(["rank=1", "rank=2", "rank=4", "rank=8"], key=tie_key)
    assert [n for n, d in at(led, 10).items() if d == "promote"] == [winner]
    for perm in itertools.permutations(settings):
        assert at(decide(spec(eta=4), list(perm), recs(table)), 10) == at(led, 10)
    # at rung 20 two settings tie again: the one ahead at rung 10 wins, whatever the hash says
    table = full({"1": 0.6, "2": 0.5, "4": 0.4, "8": 0.3}) | {k: v for k, v in full({"1": 0.7, "2": 0.7}, 20).items()}
    for c in ("r1-s0", "r1-s1", "r2-s0", "r2-s1"):
        table[c] = {**full({"1": 0.6, "2": 0.5})[c], **table[c]}
    led = decide(spec(eta=2, min_kept=1), settings, recs(table))
    assert at(led, 20) == {"rank=1": "promote", "rank=2": "stop"}


def test_exact_ties_are_compared_exactly_and_hash_decided_ties_are_flagged():
    """0.015 and 0.015000000000000001 (one float bit apart) are a tie: the hash decides it, and says so."""
    settings = grid()
    table = {"r1-s0": {10: 0.015000000000000001}, "r1-s1": {10: 0.015000000000000001}, "r2-s0": {10: 0.015},
             "r2-s1": {10: 0.015}, "r4-s0": {10: 0.4}, "r4-s1": {10: 0.4}, "r8-s0": {10: 0.0},
             "r8-s1": {10: 0.0}}
    led = decide(spec(eta=2), settings, recs(table))
    means = led["rungs"][0]["values"]
    assert means["rank=1"]["mean"] != means["rank=2"]["mean"]  # the floats differ in their last bit
    winner = min(["rank=1", "rank=2"], key=tie_key)
    assert winner == "rank=2"  # the hash favours the one whose float is a bit lower: the bit does not decide
    assert at(led, 10)[winner] == "promote" and at(led, 10)["rank=4"] == "promote"
    assert sorted(led["rungs"][0]["hash_ties"]) == ["rank=1", "rank=2"]
    assert "decided by the name's sha256" in led["rungs"][0]["basis"]["rank=1"]
    assert "sha256" not in led["rungs"][0]["basis"]["rank=4"]
    # a tie that the cut does not split is not flagged: keep 2 of rank 4 (0.4) and rank 1/2 tied below
    led = decide(spec(eta=4, min_kept=1), settings, recs(table))
    assert at(led, 10)["rank=4"] == "promote" and led["rungs"][0]["hash_ties"] == []


def test_a_failed_cell_fails_its_setting_without_a_slot_and_without_blocking_the_rung():
    table = full({"1": 0.3, "2": 0.5, "4": 0.6, "8": 0.9})
    del table["r8-s1"]  # diverged at step 5: no record at rung 10, and none will come
    led = decide(spec(), grid(), recs(table, failed={"r8-s1": 5}))
    assert at(led, 10) == {"rank=1": "stop", "rank=2": "promote", "rank=4": "promote", "rank=8": "fail"}
    assert led["rungs"][0]["keep"] == 2  # 4 settings reached the rung: floor(4/2) kept, not floor(3/2)
    assert led["state"]["rank=8"] == {"state": "failed", "rung": 10}
    # a failure after a rung keeps that rung's value; a non-finite value is a failure at its rung
    table = full({"1": 0.3, "2": 0.5, "4": 0.6, "8": 0.9})
    led = decide(spec(), grid(), recs(table, failed={"r8-s1": 15}))
    assert at(led, 10)["rank=8"] == "promote" and led["state"]["rank=8"] == {"state": "failed", "rung": 20}
    table["r8-s0"][10] = float("nan")
    assert at(decide(spec(), grid(), recs(table)), 10)["rank=8"] == "fail"


def test_direction_min_and_min_kept():
    table = full({"1": 0.3, "2": 0.5, "4": 0.6, "8": 0.9})
    assert at(decide(spec(direction="min"), grid(), recs(table)), 10) == {
        "rank=1": "promote", "rank=2": "promote", "rank=4": "stop", "rank=8": "stop"}
    led = decide(spec(eta=4, min_kept=3), grid(), recs(table))  # floor(4/4) = 1, but at least 3 kept
    assert led["rungs"][0]["keep"] == 3 and at(led, 10)["rank=1"] == "stop"


def test_the_ledger_keeps_its_decisions_and_a_new_block_re_decides():
    table = full({"1": 0.3, "2": 0.5, "4": 0.6, "8": 0.9})
    first = decide(spec(), grid(), recs(table))
    assert render(decide(spec(), grid(), recs(table), first)) == render(first)  # idempotent, byte for byte
    table = full({"1": 0.95, "2": 0.5, "4": 0.6, "8": 0.9})  # a record rewritten after the decision
    again = decide(spec(), grid(), recs(table), first)
    assert at(again, 10) == at(first, 10)  # nothing reversed ...
    assert again["conflicts"] == [{"setting": "rank=1", "rung": 10, "kept": "stop", "records_say": "promote"},
                                  {"setting": "rank=4", "rung": 10, "kept": "promote", "records_say": "stop"}]
    fresh = decide(spec(min_kept=3), grid(), recs(table), first)  # ... unless the block changes
    assert fresh["inputs_hash"] != first["inputs_hash"] and fresh["conflicts"] == []
    assert at(fresh, 10) == {"rank=1": "promote", "rank=2": "stop", "rank=4": "promote", "rank=8": "promote"}
