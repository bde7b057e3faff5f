"""Honest statistics of a study's table: mean ± sd over seeds, a 95% interval that accounts for the
number of training seeds and of evaluation problems, and each row's difference to the study's baseline row
with its minimum detectable effect.

Method (stated in every table caption, `METHOD`): a two-level t interval, seeds x problems. A row's value
is the mean over its seeds of the mean per-problem score, each problem scored by the column's metric
(`lorarl.report.data.score_problems`): avg@k and greedy pass@1 its mean correctness over its samples, pass@k
the unbiased estimator 1 - C(n-c, k)/C(n, k) of its n samples (c correct), which is "any of the n correct"
when k = n. Its variance has two parts, read off the S x P score matrix as in a two-way random-effects
design (seed, problem): the seeds' part var_s(per-seed mean) / S, with S - 1 degrees of freedom, and the
problems' part var_p(per-problem mean over seeds) / P, with P - 1 (the residual's share is counted in both,
so the sum errs on the wide side). The 95% interval is mean ± sqrt(sum_i t_{0.975, df_i}^2 v_i) (Banerjee's
interval for a sum of variance parts: at least 95% coverage whatever their true sizes; Satterthwaite's
pooled df covered 90% with two seeds of large seed spread in `bench/seed_intervals.py`): with two seeds
whose spread dominates, 12.7 standard errors, as it must be. Evaluation columns are clipped to [0, 1].

Seeds are **paired across rows** when two rows have the same seed labels: lorarl's cells of one seed share
their data order, sampling seed and adapter initialisation (`train.seed`: TRL's seed and data_seed), so
seed s of a row and seed s of its baseline are common-random-number runs, and their difference is computed
seed by seed (the two-level interval of the S x P matrix of differences). Rows whose seeds differ (an
adaptive study's added seeds, a failed cell) are compared unpaired: Welch's combination of the two rows'
seed parts and the problems' part of the difference (problems stay paired: every cell is evaluated on the
same problems). `paired_on` and the comparison text say which. A difference is *resolvable* when its 95%
interval excludes 0; the MDE is sqrt(sum_i f(df_i)^2 v_i) over the difference's parts, f(df) the noncentral-t
factor of 80% power at the 5% level over the median of the part's estimated se (`power80_factor`: 2.80 at
many df): the smallest true difference this design detects with at least 80% power. With one seed the
seeds' part is unknown: the interval covers the problems only, and its `interval` says so.
`bench/seed_intervals.py` checks coverage and the MDE's power by simulation (thousands of synthetic studies
with known truth, seeds paired and independent).
Columns without per-problem samples (train reward, times) get a t interval over seeds, clipped to the
column's range where it is bounded (lorarl.report.bounds: with two seeds the t interval is mean ± 9 sd), and
their differences Welch's t interval (its MDE the same noncentral-t factor at Welch's df).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

METHOD = ("mean ± sd over seeds [95% interval: two-level t interval over seeds and evaluation problems "
          "(Banerjee's sum of t parts); each problem scored by the column's metric: avg@k its mean correctness, pass@k the "
          "unbiased estimator, any of n correct at k = n]; vs baseline: difference of means, paired by seed when "
          "both rows have the same seeds (common random numbers: one seed = one data order, sampling seed and "
          "adapter init) and on problems, resolvable if its 95% interval excludes 0; MDE: the difference the test detects with at least "
          "80% power at α 0.05 (noncentral t per variance part). Columns without per-problem samples (train reward, step "
          "time): t interval over seeds clipped to the column's range where it is bounded, Welch's t for the "
          "difference")
Z_MDE = 1.959964 + 0.841621  # z_{0.975} + z_{0.80}: the MDE's factor at many degrees of freedom


@dataclass
class Estimate:
    mean: float
    sd: float  # over seeds (ddof 1; NaN with one seed)
    lo: float
    hi: float
    n_seeds: int
    n_problems: int
    scores_SP: np.ndarray | None = None  # per-seed, per-problem scores (kept for comparisons)
    seeds: tuple | None = None  # the seed labels of scores_SP's rows (pairing across rows)
    se: float = float("nan")  # the standard error of the mean (both parts)


@dataclass
class Comparison:
    diff: float
    lo: float
    hi: float
    mde: float
    pairing: str = "seeds"  # "seeds and problems", "problems" (unpaired seeds) or "seeds" (Welch, no problems)

    @property
    def resolvable(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)


def _t(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df)) if df < 1e6 else float(stats.norm.ppf(q))


@functools.lru_cache(maxsize=None)
def power80_factor(df: float) -> float:
    """The MDE's factor for one variance part with ``df`` degrees of freedom: the noncentrality at which the
    two-sided 5% t test has 80% power (2.80 at many df), over the median of sqrt(chi2_df / df) (the se of a
    part is estimated: its median-unbiased value), so that at a true difference equal to the median MDE the
    test is resolvable 80% of the time."""
    from scipy import optimize, stats

    if df >= 1e4:
        return Z_MDE
    crit = _t(0.975, df)
    power = lambda nc: stats.nct.sf(crit, df, nc) - 0.80  # noqa: E731  (the far tail adds < 1e-3 at 80%)
    nc = optimize.brentq(power, 0.0, 60.0)  # 80% is reached below 25 at df 1
    return float(nc / math.sqrt(stats.chi2.median(df) / df))


def _interval(mean: float, parts: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(lo, hi, se, mde) of a mean whose variance is the sum of independent parts [(variance, its df)]: the
    half-width sqrt(sum t_{0.975, df_i}^2 v_i) (Banerjee's interval: at least 95% coverage whatever the parts'
    true sizes, where Satterthwaite's df undercovers with two seeds) and the MDE sqrt(sum f(df_i)^2 v_i),
    f = `power80_factor`."""
    se = math.sqrt(sum(v for v, _ in parts))
    half = math.sqrt(sum(_t(0.975, d) ** 2 * v for v, d in parts))
    mde = math.sqrt(sum(power80_factor(d) ** 2 * v for v, d in parts))
    return mean - half, mean + half, se, mde


def _parts(scores_SP: np.ndarray) -> list[tuple[float, float]]:
    """The seeds' and the problems' variance parts of the mean of an S x P matrix, with their df."""
    S, P = scores_SP.shape
    parts = []
    if S > 1:
        parts.append((float(scores_SP.mean(axis=1).var(ddof=1)) / S, S - 1))
    if P > 1:
        parts.append((float(scores_SP.mean(axis=0).var(ddof=1)) / P, P - 1))
    return parts


def two_level(scores_SP: np.ndarray, seeds: tuple | list | None = None) -> Estimate:
    """scores_SP: per-seed, per-problem scores in [0, 1] (S seeds x P problems, same problem order);
    ``seeds`` the seed labels of its rows (for pairing with another row)."""
    scores_SP = np.asarray(scores_SP, dtype=float)
    S, P = scores_SP.shape
    per_seed = scores_SP.mean(axis=1)
    mean = float(per_seed.mean())
    lo, hi, se, _ = _interval(mean, _parts(scores_SP))
    return Estimate(mean, float(per_seed.std(ddof=1)) if S > 1 else float("nan"), float(lo), float(hi), S, P,
                    scores_SP, tuple(seeds) if seeds is not None else None, se)


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


def paired_on_seeds(row: Estimate, base: Estimate) -> bool:
    """Two rows are paired seed by seed when they have the same seed labels, each once, and more than one."""
    return (row.seeds is not None and base.seeds is not None and len(row.seeds) > 1
            and len(set(row.seeds)) == len(row.seeds) and set(row.seeds) == set(base.seeds))


def compare(row: Estimate, base: Estimate) -> Comparison:
    """row − base with a 95% interval and the minimum detectable effect: paired by seed and by problem where
    the rows share their seeds (`paired_on_seeds`), by problem only otherwise, Welch's over seeds without
    per-problem scores."""
    diff = row.mean - base.mean
    a, b = row.scores_SP, base.scores_SP
    if a is None or b is None or a.shape[1] != b.shape[1]:
        return _welch(row, base)
    if paired_on_seeds(row, base):
        order = [base.seeds.index(s) for s in row.seeds]
        parts = _parts(a - b[order])
        pairing = "seeds and problems"
    else:
        parts = [(float(m.mean(axis=1).var(ddof=1)) / m.shape[0], m.shape[0] - 1) for m in (a, b) if m.shape[0] > 1]
        if a.shape[1] > 1:
            parts.append((float((a.mean(axis=0) - b.mean(axis=0)).var(ddof=1)) / a.shape[1], a.shape[1] - 1))
        pairing = "problems"
    lo, hi, _, mde = _interval(diff, parts)
    return Comparison(diff, float(lo), float(hi), float(mde), pairing)


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
    return Comparison(diff, diff - half, diff + half, power80_factor(df) * se)


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
    unpaired = ", seeds unpaired" if c.pairing == "problems" else ""
    return txt + (", resolvable" if c.resolvable else ", not resolvable") + f" (MDE {c.mde:.2f}{unpaired})"


def mean_sd(df: pd.DataFrame, keys: list[str], cols: list[str]) -> pd.DataFrame:
    """Mean ± sd over seeds: per group of ``keys`` (first-appearance order), ``<col>_mean`` and
    ``<col>_sd`` (ddof 1: NaN with one seed) of every column, and ``n_seeds``; indexed by ``keys``."""
    g = df.groupby(keys, sort=False)[cols]
    return g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_sd")).join(g.size().rename("n_seeds"))
