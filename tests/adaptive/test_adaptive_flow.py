"""What the workflow asks for, read off the decisions (lorarl.adaptive.flow): views are the checkpoint outputs,
a view not written yet raises (as Snakemake's IncompleteCheckpointException does), and nothing past a rung is
asked for before the rung's decision allows it. The decisions read through the flow are the ledger's, for SH
and ASHA, whatever order the views are written in; a hypothesis asks for the next seed only while undecided."""

from __future__ import annotations

import random

import pytest

from lorarl.adaptive.flow import ALL, FINISH, FlowError, HypothesisFlow, SearchFlow
from lorarl.adaptive.halving import decide
from tests.support.adaptive import grid, recs, spec

RESULTS, STUDY = "res", "st"


class NotYet(Exception):
    """Stands for Snakemake's IncompleteCheckpointException."""


def values(levels: dict[str, list[float]]) -> dict:
    """rank -> its level at rungs 10, 20 (seed 0 a bit below, seed 1 a bit above)."""
    out = {}
    for r, lv in levels.items():
        for s, d in (("0", -0.01), ("1", 0.01)):
            out[f"r{r}-s{s}"] = {step: v + d for step, v in zip((10, 20), lv)}
    return recs(out)


class Checkpoints:
    """Views written on demand: each request of a view not written yet is recorded and raises NotYet, as a
    checkpoint does; ``run()`` writes the requested views (a decision job: the ledger's rung, records on disk)."""

    def __init__(self, sp, settings, records):
        self.sp, self.settings, self.records = sp, settings, records
        self.written, self.asked = {}, []

    def get(self, step, n):
        if (step, n) not in self.written:
            self.asked.append((step, n))
            raise NotYet((step, n))
        return self.written[(step, n)]

    def run(self):
        led = decide(self.sp, self.settings, self.records)
        for step, n in dict.fromkeys(self.asked):
            rung = next(r for r in led["rungs"] if r["step"] == step)
            assert n != ALL or rung["complete"]  # a whole rung's view is written only once it is complete
            self.written[(step, n)] = {**rung, "failed": {}}
        self.asked = []
        return led


def drive(flow: SearchFlow, ck: Checkpoints, ask):
    """Ask until the answer comes, running the checkpoints each time one is missing (Snakemake's loop)."""
    for _ in range(50):
        try:
            return ask()
        except NotYet:
            ck.run()
    raise AssertionError("never answered")


@pytest.mark.parametrize("rule", ["sha", "asha"])
def test_fates_read_through_the_views_are_the_ledgers(rule):
    settings = grid()
    sp = spec(rule=rule)
    records = values({"1": [0.3, 0.0], "2": [0.5, 0.4], "4": [0.6, 0.7], "8": [0.2, 0.0]})
    ck = Checkpoints(sp, settings, records)
    flow = SearchFlow(sp, settings, ck.get)
    fates = {s.name: drive(flow, ck, lambda s=s: flow.fate(s.name)) for s in settings}
    assert fates == {"rank=1": ("stop", 0), "rank=2": ("stop", 1), "rank=4": (FINISH, 2), "rank=8": ("stop", 0)}
    led = decide(sp, settings, records)
    for name, (fate, k) in fates.items():
        want = led["state"][name]
        assert want["state"] == {"stop": "stopped", FINISH: "finishing"}[fate]
    # what each rule asks for: the next segment only once promoted; nothing of a stopped cell past its rung
    assert flow.segment_inputs(RESULTS, STUDY, "r4-s0", 10) == []
    assert flow.segment_inputs(RESULTS, STUDY, "r4-s0", 20) == ["res/st/r4-s0/rungs/step-10.json"]
    assert flow.final_inputs(RESULTS, STUDY, "r4-s1") == ["res/st/r4-s1/rungs/step-20.json"]
    assert flow.step_eval_inputs(RESULTS, STUDY, "r2-s0", 20) == ["res/st/r2-s0/rungs/step-20.json"]
    assert flow.step_eval_inputs(RESULTS, STUDY, "r4-s0", 30) is None  # past the last rung: the final job's
    with pytest.raises(FlowError, match="stopped at step 10"):
        flow.segment_inputs(RESULTS, STUDY, "r1-s0", 20)
    with pytest.raises(FlowError, match="stopped at step 10"):
        flow.step_eval_inputs(RESULTS, STUDY, "r8-s0", 20)
    with pytest.raises(FlowError, match="not trained to its end"):
        flow.final_inputs(RESULTS, STUDY, "r2-s0")
    assert sorted(drive(flow, ck, lambda: flow.view_cells(1, ALL))) == ["r2-s0", "r2-s1", "r4-s0", "r4-s1"]


def test_nothing_past_a_rung_is_asked_before_its_view():
    settings = grid()
    sp = spec()
    ck = Checkpoints(sp, settings, values({"1": [0.3, 0.0], "2": [0.5, 0.4], "4": [0.6, 0.7], "8": [0.2, 0.0]}))
    flow = SearchFlow(sp, settings, ck.get)
    assert flow.segment_inputs(RESULTS, STUDY, "r1-s0", 10) == []  # the first segment needs no decision
    with pytest.raises(NotYet):
        flow.segment_inputs(RESULTS, STUDY, "r4-s0", 20)  # rung 10 undecided: its segment to 20 waits
    assert ck.asked == [(10, ALL)]  # ... on the whole rung's view (SH), nothing else


def test_asha_promotes_from_prefix_views_in_any_order():
    """ASHA: a setting is read promoted from the first prefix view that decides it (eta settings in), before
    its rung is complete; views written in random orders give the same decisions."""
    settings = grid(ranks=("1", "2", "4", "8", "16", "32"))
    sp = spec(rule="asha")
    lv = {"1": [0.9, 0.9], "2": [0.1, 0.1], "4": [0.5, 0.6], "8": [0.3, 0.2], "16": [0.2, 0.1], "32": [0.8, 0.95]}
    records = values(lv)
    ck = Checkpoints(sp, settings, records)
    flow = SearchFlow(sp, settings, ck.get)
    assert drive(flow, ck, lambda: flow.decision("rank=1", 0)) == "promote"
    assert (10, 2) in ck.written and (10, ALL) not in ck.written  # decided from the view of the first 2 settings
    want = {s.name: drive(flow, ck, lambda s=s: flow.fate(s.name)) for s in settings}
    for seed in range(5):  # the same decisions when the views come in another order
        ck2 = Checkpoints(sp, settings, records)
        flow2 = SearchFlow(sp, settings, ck2.get)
        order = [s.name for s in settings]
        random.Random(seed).shuffle(order)
        assert {n: drive(flow2, ck2, lambda n=n: flow2.fate(n)) for n in order} == want


def test_a_hypothesis_asks_for_the_next_seed_only_while_undecided():
    seeds = [(str(s), f"a-s{s}", f"b-s{s}") for s in range(6)]
    looks = {3: {"decision": "undecided"}, 4: {"decision": "undecided"}, 5: {"decision": "supported"}}
    asked = []

    def get(n):
        asked.append(n)
        return looks[n]

    hf = HypothesisFlow({"min_seeds": 3, "max_seeds": 6}, seeds, get)
    assert hf.look_cells(3) == ["a-s0", "b-s0", "a-s1", "b-s1", "a-s2", "b-s2"]
    assert hf.last_look() == 5 and asked == [3, 4, 5]  # seed 5 (the sixth) is never asked for
    assert hf.used_cells()[-2:] == ["a-s4", "b-s4"]
    capped = HypothesisFlow({"min_seeds": 3, "max_seeds": 4}, seeds, lambda n: {"decision": "undecided"})
    assert capped.last_look() == 4  # the cap: inconclusive, no seed past it
    with pytest.raises(FlowError):
        capped.look_cells(5)
