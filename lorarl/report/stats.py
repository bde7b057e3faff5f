"""Honest statistics of a study's table: mean ± sd over seeds, a 95% interval that accounts for the
number of evaluation problems, and each row's difference to the study's baseline row with its
minimum detectable effect.

Method (stated in every table caption, `METHOD`): a two-level (hierarchical) bootstrap. Each
replicate resamples the seeds of a row with replacement and, independently, the evaluation problems
with replacement; the same problem draw is applied to every seed and to every row of a comparison
(all cells are evaluated on the same problems, so differences are paired on problems while seeds of
different rows are independent runs). The statistic is the mean over the drawn seeds of the mean
per-problem score, each problem scored by the column's metric (`lorarl.report.data.score_problems`):
avg@k and greedy pass@1 its mean correctness over its samples, pass@k the unbiased estimator
1 - C(n-c, k)/C(n, k) of its n samples (c correct), which is "any of the n correct" when k = n; the
mean over problems is the cell's value in the table.
The 95% interval is the 2.5/97.5 percentile of the replicates. A difference is *resolvable* when its
95% interval excludes 0; the MDE is (z_0.975 + z_0.8) × the bootstrap sd of the difference: the
smallest true difference this design detects with 80% power at the 5% level.
Columns without per-problem samples (train reward, times) get a t interval over seeds, clipped to the
column's range where it is bounded (lorarl.report.bounds: with two seeds the t interval is mean ± 9 sd), and
their differences Welch's t interval (MDE = 2.80 × its standard error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

METHOD = ("mean ± sd over seeds [95% interval: bootstrap over seeds and evaluation problems, 2000 "
          "replicates, problems paired across rows; each problem scored by the column's metric: avg@k its mean "
          "correctness, pass@k the unbiased estimator, any of n correct at k = n]; vs baseline: difference of "
          "means, resolvable if its 95% bootstrap interval excludes 0; MDE = 2.80 × bootstrap sd of the "
          "difference (80% power, α 0.05). Columns without per-problem samples (train reward, step time): "
          "t interval over seeds clipped to the column's range where it is bounded, Welch's t for the difference")
N_BOOT = 2000  # replicates: percentile ends stable to ~0.005 at 2000
Z_MDE = 1.959964 + 0.841621  # z_{0.975} + z_{0.80}


@dataclass
class Estimate:
    mean: float
    sd: float  # over seeds (ddof 1; NaN with one seed)
    lo: float
    hi: float
    n_seeds: int
    n_problems: int
    boot: np.ndarray | None = None  # the replicates (kept for comparisons)


@dataclass
class Comparison:
    diff: float
    lo: float
    hi: float
    mde: float

    @property
    def resolvable(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def problem_draws(n_problems: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot, P] problem indices, shared by every row of a table (paired comparisons)."""
    return _rng(seed).integers(0, n_problems, size=(n_boot, n_problems))


def bootstrap(scores_SP: np.ndarray, draws_BP: np.ndarray, seed: int = 1) -> Estimate:
    """scores_SP: per-seed, per-problem scores in [0, 1] (S seeds x P problems, same problem order)."""
    scores_SP = np.asarray(scores_SP, dtype=float)
    S, P = scores_SP.shape
    if draws_BP.shape[1] != P:
        raise ValueError(f"problem draws are over {draws_BP.shape[1]} problems, scores over {P}")
    per_seed = scores_SP.mean(axis=1)
    seeds_BS = _rng(seed).integers(0, S, size=(draws_BP.shape[0], S))
    # mean over drawn problems for every seed, then mean over drawn seeds: [B, S] -> [B]
    prob_means_BS = np.stack([scores_SP[s][draws_BP].mean(axis=1) for s in range(S)], axis=1)
    boot_B = np.take_along_axis(prob_means_BS, seeds_BS, axis=1).mean(axis=1)
    lo, hi = np.percentile(boot_B, [2.5, 97.5])
    return Estimate(float(per_seed.mean()), float(per_seed.std(ddof=1)) if S > 1 else float("nan"),
                    float(lo), float(hi), S, P, boot_B)


def t_interval(values: list[float] | np.ndarray, bounds: tuple[float, float] | None = None) -> Estimate:
    """Mean ± sd over seeds with a Student-t 95% interval (no problem-level samples), clipped to ``bounds``,
    the column's range where it is bounded (lorarl.report.bounds)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=float)
    n = len(v)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), float("nan"), 0, 0)
    mean = float(v.mean())
    if n == 1:
        return Estimate(mean, float("nan"), float("nan"), float("nan"), 1, 0)
    sd = float(v.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    if bounds is None:
        return Estimate(mean, sd, mean - half, mean + half, n, 0)
    return Estimate(mean, sd, max(mean - half, bounds[0]), min(mean + half, bounds[1]), n, 0)


def compare(row: Estimate, base: Estimate) -> Comparison:
    """row − base with a 95% bootstrap interval and the minimum detectable effect."""
    diff = row.mean - base.mean
    if row.boot is None or base.boot is None:
        return _welch(row, base)
    d_B = row.boot - base.boot
    lo, hi = np.percentile(d_B, [2.5, 97.5])
    return Comparison(diff, float(lo), float(hi), float(Z_MDE * d_B.std(ddof=1)))


def _welch(row: Estimate, base: Estimate) -> Comparison:
    """No per-problem samples: Welch's t interval of the difference over seeds, MDE from its se."""
    from scipy import stats

    diff = row.mean - base.mean
    if min(row.n_seeds, base.n_seeds) < 2 or math.isnan(row.sd) or math.isnan(base.sd):
        return Comparison(diff, float("nan"), float("nan"), float("nan"))
    v1, v2 = row.sd ** 2 / row.n_seeds, base.sd ** 2 / base.n_seeds
    se = math.sqrt(v1 + v2)
    if se == 0:
        return Comparison(diff, diff, diff, 0.0)
    df = (v1 + v2) ** 2 / (v1 ** 2 / (row.n_seeds - 1) + v2 ** 2 / (base.n_seeds - 1))
    half = float(stats.t.ppf(0.975, df)) * se
    return Comparison(diff, diff - half, diff + half, Z_MDE * se)


def fmt_estimate(e: Estimate, digits: int = 3) -> str:
    f = f"{{:.{digits}f}}"
    out = f.format(e.mean)
    if not math.isnan(e.sd):
        out += " ± " + f.format(e.sd)
    if not math.isnan(e.lo):
        out += f" [{e.lo:.2f}, {e.hi:.2f}]"
    return out


def fmt_comparison(c: Comparison, label: str, digits: int = 3) -> str:
    """`vs full: −0.008, not resolvable (MDE 0.06)`."""
    sign = "+" if c.diff >= 0 else "−"
    txt = f"vs {label}: {sign}{abs(c.diff):.{digits}f}"
    if math.isnan(c.mde):
        return txt
    return txt + (", resolvable" if c.resolvable else ", not resolvable") + f" (MDE {c.mde:.2f})"


def mean_sd(df: pd.DataFrame, keys: list[str], cols: list[str]) -> pd.DataFrame:
    """Mean ± sd over seeds: per group of ``keys`` (first-appearance order), ``<col>_mean`` and
    ``<col>_sd`` (ddof 1: NaN with one seed) of every column, and ``n_seeds``; indexed by ``keys``."""
    g = df.groupby(keys, sort=False)[cols]
    return g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_sd")).join(g.size().rename("n_seeds"))
