"""Hypotheses seed by seed (lorarl.adaptive.sequential, lorarl.adaptive.hypotheses): the calibrated
boundaries spend what they claim, each kind decides by its rule, and the bookkeeping of seeds (pending,
failed, the cap, censored) says when another seed is needed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lorarl.adaptive.hypotheses import FAILED, hypothesis_state, paired_difference
from lorarl.adaptive.sequential import boundaries, critical_value, interval
from lorarl.language.adaptive.blocks import HypothesisSpec


def hyp(kind="superiority", margin=0.0, **kw):
    return HypothesisSpec(kind=kind, a={"rank": 8}, b={"rank": 1}, margin=margin, **kw)


def obs(*ds):
    return [(str(i), d) for i, d in enumerate(ds)]


def test_boundaries_are_deterministic_and_spend_their_alpha_on_fresh_null_paths():
    b = boundaries(3, 10, 0.05, 2.0)
    assert len(b) == 8 and b == boundaries.__wrapped__(3, 10, 0.05, 2.0)  # recomputed: the same numbers
    assert all(x > y for x, y in zip(b, b[1:]))  # more seeds, tighter
    assert critical_value(2, 3, 10, 0.05, 2.0) == math.inf and critical_value(12, 3, 10, 0.05, 2.0) == b[-1]
    # Gaussian null paths the calibration never saw, with another spread: P(|T_n| > c_n at some look) = 2 alpha
    rng = np.random.default_rng(11)
    x = rng.normal(0.0, 0.03, (40_000, 10))
    n = np.arange(1, 11)
    mean = np.cumsum(x, 1) / n
    sd = np.sqrt(np.maximum(np.cumsum(x * x, 1) - n * mean ** 2, 0) / np.maximum(n - 1, 1))
    t = np.abs(mean[:, 2:]) * np.sqrt(n[2:]) / sd[:, 2:]  # looks at n = 3..10
    crossed = (t > np.array(b)).any(1).mean()
    assert abs(crossed - 0.10) < 0.008, crossed


def test_interval_is_mean_plus_minus_c_standard_errors():
    mean, lo, hi = interval([0.1, 0.2, 0.3], 2.0)
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(2.0 * 0.1 / math.sqrt(3))
    assert interval([0.1, 0.2], math.inf)[1:] == (-math.inf, math.inf)
    assert interval([0.1, 0.1, 0.1], 2.0)[1:] == (-math.inf, math.inf)  # no spread measured: no evidence


def test_each_kind_decides_by_its_rule():
    tight = obs(0.050, 0.051, 0.049)  # clearly +0.05 at the first look (n = 3)
    r = hypothesis_state(hyp("superiority", 0.0), tight)
    assert r["decision"] == "supported" and r["seeds_used"] == 3 and r["needs_seeds"] == 0
    assert r["interval"][0] > 0 and r["claim"].startswith("a is better")
    assert hypothesis_state(hyp("superiority", 0.06), tight)["decision"] == "refuted"
    assert hypothesis_state(hyp("non_inferiority", 0.02), obs(-0.010, -0.011, -0.009))["decision"] == "supported"
    assert hypothesis_state(hyp("non_inferiority", 0.002), obs(-0.010, -0.011, -0.009))["decision"] == "refuted"
    assert hypothesis_state(hyp("equivalence", 0.02), obs(0.001, 0.0, -0.001))["decision"] == "supported"
    assert hypothesis_state(hyp("equivalence", 0.02), obs(0.050, 0.051, 0.049))["decision"] == "refuted"
    # direction min: a lower metric is better, so d = b - a (paired_difference flips the sign)
    assert paired_difference({"p1": 0.2, "p2": 0.4}, {"p1": 0.5, "p2": 0.5, "p3": 1.0}, "min") == pytest.approx(0.2)
    assert paired_difference({"p1": 1.0}, {"p2": 1.0}) is None


def test_an_open_comparison_asks_for_seeds_until_its_cap():
    noisy = [0.03, -0.02, 0.05, -0.01, 0.02]
    r = hypothesis_state(hyp(max_seeds=6), obs(*noisy[:2]))
    assert (r["decision"], r["needs_seeds"], r["looks"]) == ("undecided", 1, [])  # min_seeds 3: one more first
    r = hypothesis_state(hyp(min_seeds=4, max_seeds=6), obs(0.03))
    assert r["needs_seeds"] == 3
    r = hypothesis_state(hyp(max_seeds=6), obs(*noisy))
    assert r["decision"] == "undecided" and r["needs_seeds"] == 1 and [x["n"] for x in r["looks"]] == [3, 4, 5]
    r = hypothesis_state(hyp(max_seeds=5), obs(*noisy))
    assert r["decision"] == "inconclusive" and r["needs_seeds"] == 0 and r["seeds_used"] == 5


def test_pending_and_failed_seeds():
    # seed 1 is still missing: seeds 2.. wait behind it, and no seed is added meanwhile
    r = hypothesis_state(hyp(), [("0", 0.05), ("1", None), ("2", 0.05), ("3", 0.05)])
    assert r["pending"] and r["needs_seeds"] == 0 and r["looks"] == [] and r["seeds_started"] == 4
    # a failed seed is skipped and reported; it counts against the cap, so it is replaced only up to it
    r = hypothesis_state(hyp(max_seeds=4), obs(0.03, FAILED, -0.02, 0.05))
    assert r["seeds_failed"] == ["1"] and r["seeds_used"] == 3 and r["looks"][0]["seed"] == "3"
    assert r["decision"] == "inconclusive" and r["needs_seeds"] == 0
    r = hypothesis_state(hyp(max_seeds=6), obs(0.03, FAILED, -0.02, 0.05))
    assert r["decision"] == "undecided" and r["needs_seeds"] == 1
    assert hypothesis_state(hyp(), obs(0.05, 0.05, 0.05), censored=True)["decision"] == "censored"
