"""The stats table's two-level intervals hold their stated coverage by simulation (bench/seed_intervals.py on a
small subset): seeds paired and independent, two and three seeds. The bench's vectorised copy of the formulas
is checked study by study against lorarl.report.stats inside `scenario`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from lorarl.report import stats

BENCH = Path(__file__).resolve().parents[2] / "bench" / "seed_intervals.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("seed_intervals", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("S,regime", [(2, "paired"), (3, "independent")])
def test_intervals_cover_at_least_the_stated_95(bench, S, regime):
    r = bench.scenario(np.random.default_rng(S), 600, S, 200, regime)
    # 600 studies: a 95% interval covers >= 0.93 but by chance (binomial sd 0.009)
    assert min(r["row"], r["paired"], r["unpaired"]) >= 0.93, r
    # the MDE is met: at a true difference equal to the median MDE, at least ~80% of studies resolve it
    for kind in ("paired", "unpaired"):
        if not np.isnan(r[f"power_{kind}"]):
            assert r[f"power_{kind}"] >= 0.74, r
    if regime == "paired":  # a shared seed effect: pairing by seed narrows the MDE
        assert r["mde_paired"] < 0.8 * r["mde_unpaired"]


def test_power_factor_is_the_noncentral_t_one():
    assert stats.power80_factor(1e5) == pytest.approx(2.8016, abs=1e-3)
    assert stats.power80_factor(199) == pytest.approx(2.82, abs=0.01)
    assert stats.power80_factor(1) > stats.power80_factor(2) > stats.power80_factor(9) > 2.8
