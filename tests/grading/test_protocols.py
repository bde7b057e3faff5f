"""Protocol arithmetic: unbiased pass@k against brute-force enumeration, avg@k, intervals."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from pydantic import ValidationError

from lorarl.grading.protocols import (Protocol, avg_at_k, greedy_pass_at_1, mean_pass_at_k,
                                       pass_at_k, per_problem_pass_at_k, summarize,
                                       wilson_interval)


def brute_pass_at_k(row: list[bool], k: int) -> float:
    """Fraction of all k-subsets of the samples containing at least one correct one."""
    subsets = list(itertools.combinations(range(len(row)), k))
    return sum(any(row[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        row = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(row, k), abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_is_not_any_of_n():
    # 1 correct of 4: "any of n" says 1.0, the unbiased pass@2 says 1/2
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0          # k == n is "any of n"
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)   # pass@1 == mean correctness


def test_pass_at_k_large_n_is_stable():
    v = pass_at_k(1024, 3, 16)
    assert v == pytest.approx(1 - math.comb(1021, 16) / math.comb(1024, 16), rel=1e-9)
    assert 0 < v < 1


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_matrix_metrics_match_enumeration():
    rng = random.Random(0)
    rows = [[rng.random() < 0.3 for _ in range(6)] for _ in range(25)]
    for k in range(1, 7):
        expected = sum(brute_pass_at_k(r, k) for r in rows) / len(rows)
        assert mean_pass_at_k(rows, k) == pytest.approx(expected)
    assert avg_at_k(rows) == pytest.approx(sum(map(sum, rows)) / (25 * 6))
    assert avg_at_k(rows) == pytest.approx(mean_pass_at_k(rows, 1))
    assert per_problem_pass_at_k(rows, 6) == [float(any(r)) for r in rows]


def test_avg_at_k_weights_problems_equally():
    rows = [[True, True, True, True], [False, False]]   # unequal sample counts
    assert avg_at_k(rows) == pytest.approx(0.5)


def test_greedy_and_empty():
    assert greedy_pass_at_1([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        greedy_pass_at_1([])
    with pytest.raises(ValueError):
        avg_at_k([[]])


def test_wilson_interval():
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    lo, hi = wilson_interval(0, 30)
    assert lo == 0.0 and 0.10 < hi < 0.12
    lo, hi = wilson_interval(30, 30)
    assert hi == 1.0 and 0.88 < lo < 0.9
    with pytest.raises(ValueError):
        wilson_interval(5, 0)


def test_protocol_defaults_and_inference():
    g = Protocol.greedy()
    assert (g.kind, g.n, g.ks, g.max_new_tokens, g.metric_names) == ("greedy", 1, (1,), 4096,
                                                                     ["pass@1"])
    s = Protocol.sampling(32)
    assert (s.temperature, s.top_p, s.ks) == (0.6, 0.95, (32,))
    assert s.metric_names == ["avg@32", "pass@32"] and s.primary_metric == "avg@32"
    assert Protocol(temperature=0.7, n=4).kind == "sample"
    assert Protocol(temperature=0.7, n=4).ks == (4,)
    assert Protocol().kind == "greedy"
    assert Protocol.model_validate(s.model_dump()) == s


@pytest.mark.parametrize("kwargs", [
    dict(kind="greedy", temperature=0.6),
    dict(kind="greedy", n=4),
    dict(kind="sample", temperature=0.0, n=4),
    dict(temperature=0.6, n=4, ks=(8,)),
    dict(temperature=0.6, n=4, ks=(4, 1)),
    dict(temperature=0.6, n=4, ks=()),
    dict(temperature=0.6, n=4, top_p=0.0),
    dict(temperature=0.6, n=4, top_p=1.5),
    dict(max_new_tokens=0),
    dict(n=0),
    dict(typo=1),
])
def test_protocol_validation(kwargs):
    with pytest.raises(ValidationError):
        Protocol(**kwargs)


def test_summarize_sampling_and_greedy():
    rows = [[True, False, False, False], [True, True, True, True], [False] * 4]
    m = summarize(rows, Protocol.sampling(4, ks=(1, 2, 4)))
    assert list(m) == ["avg@4", "pass@1", "pass@2", "pass@4"]
    assert m["avg@4"].value == pytest.approx((0.25 + 1 + 0) / 3)
    assert m["pass@2"].value == pytest.approx((0.5 + 1 + 0) / 3)
    assert m["pass@4"].value == pytest.approx(2 / 3)
    assert all(x.n_problems == 3 and x.ci_low <= x.value <= x.ci_high for x in m.values())
    g = summarize([[True], [False]], Protocol.greedy())
    assert g["pass@1"].value == 0.5
    assert (g["pass@1"].ci_low, g["pass@1"].ci_high) == wilson_interval(1, 2)
    with pytest.raises(ValueError):
        summarize([[True, False]], Protocol.sampling(4))
