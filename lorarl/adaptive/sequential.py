"""Group-sequential repeated confidence intervals over seeds, one look per added seed.

The design (Jennison & Turnbull 2000, ch. 7 and 9: repeated confidence intervals with an alpha
spending function, Lan & DeMets 1983; the power family of Kim & DeMets 1987):

* observations: the per-seed paired differences d_1, d_2, ... (i.i.d., mean delta, unknown spread);
* looks at n = min_seeds, ..., max_seeds seeds; at look n the statistic T_n = mean / (sd / sqrt n)
  (Student's t, n - 1 degrees of freedom);
* each side of the interval spends ``alpha * (n / max_seeds) ** rho`` of its error by look n;
* the critical values c_n solve P(|T_j| <= c_j for j < n, |T_n| > c_n) = 2 * (spent_n - spent_{n-1})
  under delta = 0. For Gaussian differences that joint law does not depend on the unknown spread (T is
  scale-free), so the c_n are calibrated once per design on 2^18 simulated null paths (a fixed seed of
  numpy's frozen legacy generator: the same numbers on every machine and numpy release); the
  calibration's own error moves the spent alpha by about 3e-4;
* the repeated interval at look n is mean ± c_n sd / sqrt(n); with probability at least 1 - 2 alpha it
  holds delta at every look at once, so each one-sided claim read off it (lower bound above a margin,
  upper bound below one) is wrong with probability at most alpha, however many looks are taken.

Skipping looks (several seeds arriving at once) only makes the claims more conservative; the
decision itself is made at the first look (in seed order) whose interval decides, so it is a pure
function of the recorded differences. bench/adaptive_hypotheses.py measures the error rates and the
seeds saved on problem-level Bernoulli data with seed-level random effects.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

__all__ = ["boundaries", "critical_value", "interval", "CAL_PATHS", "CAL_SEED"]

CAL_PATHS = 2 ** 18  # simulated null paths per design (the calibration's sd of spent alpha ~ 3e-4)
CAL_SEED = 20240531  # numpy's legacy RandomState: its stream is frozen across numpy releases


@functools.lru_cache(maxsize=128)
def boundaries(min_seeds: int, max_seeds: int, alpha: float, rho: float,
               n_paths: int = CAL_PATHS) -> tuple[float, ...]:
    """Critical values c_n of |T_n| for n = min_seeds..max_seeds (math.inf where nothing is spent)."""
    if not 2 <= min_seeds <= max_seeds:
        raise ValueError(f"need 2 <= min_seeds <= max_seeds, got {min_seeds}, {max_seeds}")
    rs = np.random.RandomState(CAL_SEED)
    s = np.zeros(n_paths)
    ss = np.zeros(n_paths)
    alive = np.ones(n_paths, dtype=bool)
    crossed = 0
    out: list[float] = []
    for n in range(1, max_seeds + 1):
        x = rs.standard_normal(n_paths)
        s += x
        ss += x * x
        if n < min_seeds:
            continue
        mean = s / n
        sd = np.sqrt(np.maximum(ss - n * mean * mean, 0.0) / (n - 1))
        t = np.abs(mean) * math.sqrt(n) / np.where(sd > 0, sd, np.finfo(float).tiny)
        want = int(round(2 * alpha * (n / max_seeds) ** rho * n_paths)) - crossed
        live = t[alive]
        if want <= 0:
            c = math.inf
        elif want >= live.size:
            c = 0.0
        else:
            part = np.partition(live, live.size - want - 1)  # the (want+1)-th largest sits at that index
            lo, hi = float(part[live.size - want - 1]), float(part[live.size - want:].min())
            c = (lo + hi) / 2
        hit = alive & (t > c)
        crossed += int(hit.sum())
        alive &= ~hit
        out.append(round(c, 6) if math.isfinite(c) else math.inf)
    return tuple(out)


def critical_value(n: int, min_seeds: int, max_seeds: int, alpha: float, rho: float) -> float:
    """c_n of the design (math.inf before the first look; the last look's value past the cap)."""
    if n < min_seeds:
        return math.inf
    return boundaries(min_seeds, max_seeds, alpha, rho)[min(n, max_seeds) - min_seeds]


def interval(d: Sequence[float], c: float) -> tuple[float, float, float]:
    """(mean, lower, upper) of the repeated interval mean ± c sd / sqrt(n) of differences ``d``; unbounded
    before the first look (c infinite) and while the differences have no spread (sd 0)."""
    n = len(d)
    mean = math.fsum(d) / n
    if not math.isfinite(c) or n < 2:
        return mean, -math.inf, math.inf
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    if sd <= 1e-12:  # equal differences (a few problems, discrete scores): no spread measured, no evidence yet
        return mean, -math.inf, math.inf
    half = c * sd / math.sqrt(n)
    return mean, mean - half, mean + half
