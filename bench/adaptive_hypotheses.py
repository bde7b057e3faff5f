"""Hypotheses by simulation (issue 40, item 5c): error rates, power and seeds of the sequential design.

    python bench/adaptive_hypotheses.py [--studies 10000] [--problems 500] [--max-seeds 10] [--spending 2]

Each simulated study compares two settings a and b seed by seed, exactly as lorarl.adaptive.hypotheses
does: per seed s, each setting's cell answers N held-out problems (greedy pass@1): problem p is solved
with probability sigmoid(a_p + beta_cell + w_s + u_cell,s), a_p the problem's difficulty (N(0, 2^2), one
fixed benchmark), w_s a seed effect both settings share (N(0, 0.05^2): same data order and init seed),
u a cell's own training noise (N(0, 0.10^2)), beta = 0 for b and the value giving the scenario's true
difference delta of expected pass@1 for a (Gauss-Hermite, then a root). The observation of seed s is
the paired difference of pass@1 over the problems (paired by seed and by problem).

Per kind, at its margin m (superiority m = 0, non-inferiority m = 0.04, equivalence m = 0.05) the
null scenario sits on the boundary of the claim (delta = m, -m, and +-m for equivalence): the claim's
rate there is the type-I error (<= alpha + 0.01 required). The alternative (superiority delta = 0.045,
the others delta = 0) gives the power and the mean number of seeds used; the fixed design of equal
power is the smallest number of seeds whose one-sided t-test (TOST for equivalence) at alpha has at
least that power on the same simulated seeds. The decisions are vectorised here and checked, study by
study, against lorarl.adaptive.hypotheses.hypothesis_state on the first 200 studies of every scenario.

RL's own failure modes (``--bad-seeds``, on by default): per-seed differences drawn directly, with mean exactly
at the claim's boundary: the issue's mixture 0.9 N(+0.01, 0.015^2) + 0.1 N(-0.09, 0.03^2) (mean 0), bad seeds
at rates q in {2, 5, 20%} (bad N(-0.09, 0.03^2), good N(+0.09 q / (1 - q), 0.015^2): mean 0), and negatively
skewed differences (a gamma flipped: skewness -1 and -2, sd 0.02), beside Gaussian ones (sd 0.02). Per scenario
and kind: the sequential design's type-I error, the fixed t-test's at the cap, and the price: the fewest seeds a
fixed one-sided t-test at alpha needs to hold alpha + 0.01 from there on (on a grid of 3..400 seeds; "> 400"
where it does not).
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np
from scipy import optimize, special, stats

from lorarl.adaptive.hypotheses import SUPPORTED, hypothesis_state
from lorarl.adaptive.sequential import boundaries

TAU_CELL, TAU_SEED, DIFFICULTY_SD = 0.10, 0.05, 2.0  # logit sd of a cell's seed noise, the shared seed effect, a_p
KINDS = {  # kind -> (margin, null deltas, alternative delta)
    "superiority": (0.0, (0.0,), 0.045),
    "non_inferiority": (0.04, (-0.04,), 0.0),
    "equivalence": (0.05, (0.05, -0.05), 0.0),
}


def expected_pass1(a_P: np.ndarray, beta: float) -> float:
    """E[pass@1] of a cell with logit shift ``beta`` over the random seed effects (Gauss-Hermite)."""
    x, w = np.polynomial.hermite_e.hermegauss(48)
    sd = math.hypot(TAU_CELL, TAU_SEED)
    return float(np.mean(special.expit(a_P[:, None] + beta + sd * x[None, :]) @ (w / w.sum())))


def beta_for(a_P: np.ndarray, delta: float) -> float:
    base = expected_pass1(a_P, 0.0)
    return optimize.brentq(lambda b: expected_pass1(a_P, b) - base - delta, -5.0, 5.0, xtol=1e-12)


def simulate(rng: np.random.Generator, a_P: np.ndarray, beta: float, studies: int, seeds: int) -> np.ndarray:
    """[studies, seeds] paired differences of pass@1 (a - b), problem-level Bernoulli draws."""
    n_prob = a_P.size
    out = np.empty((studies, seeds))
    chunk = max(1, 4_000_000 // (seeds * n_prob))
    for i in range(0, studies, chunk):
        m = min(chunk, studies - i)
        w = rng.normal(0.0, TAU_SEED, (m, seeds, 1))
        p_a = special.expit(a_P + beta + w + rng.normal(0.0, TAU_CELL, (m, seeds, 1))).astype(np.float32)
        p_b = special.expit(a_P + w + rng.normal(0.0, TAU_CELL, (m, seeds, 1))).astype(np.float32)
        solved_a = (rng.random((m, seeds, n_prob), dtype=np.float32) < p_a).sum(-1)
        solved_b = (rng.random((m, seeds, n_prob), dtype=np.float32) < p_b).sum(-1)
        out[i:i + m] = (solved_a - solved_b) / n_prob
    return out


def verdicts(kind: str, m: float, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(supported, refuted) per study: lorarl.adaptive.hypotheses' rule, vectorised."""
    if kind == "superiority":
        return lo > m, hi < m
    if kind == "non_inferiority":
        return lo > -m, hi < -m
    return (lo > -m) & (hi < m), (lo > m) | (hi < -m)


def sequential(d_SN: np.ndarray, kind: str, m: float, alpha: float, lo_n: int, hi_n: int,
               rho: float) -> tuple[np.ndarray, np.ndarray]:
    """(supported, seeds used) of the sequential design on each simulated study."""
    c = boundaries(lo_n, hi_n, alpha, rho)
    s = d_SN.shape[0]
    csum, csq = np.cumsum(d_SN[:, :hi_n], 1), np.cumsum(d_SN[:, :hi_n] ** 2, 1)
    supported, done, used = np.zeros(s, bool), np.zeros(s, bool), np.full(s, hi_n)
    for k, n in enumerate(range(lo_n, hi_n + 1)):
        mean = csum[:, n - 1] / n
        sd = np.sqrt(np.maximum(csq[:, n - 1] - n * mean * mean, 0.0) / (n - 1))
        half = np.where(sd > 1e-12, c[k] * sd / math.sqrt(n), np.inf)
        yes, no = verdicts(kind, m, mean - half, mean + half)
        new = ~done & (yes | no)
        supported |= ~done & yes
        used[new] = n
        done |= new
    return supported, used


def fixed_power(d_SN: np.ndarray, kind: str, m: float, alpha: float) -> dict[int, float]:
    """Power of the fixed design with n seeds (one-sided t-test at alpha; TOST for equivalence)."""
    out = {}
    for n in range(2, d_SN.shape[1] + 1):
        x = d_SN[:, :n]
        mean, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
        se = np.where(se > 0, se, np.inf)
        t = stats.t.ppf(1 - alpha, n - 1)
        if kind == "superiority":
            ok = (mean - m) / se > t
        elif kind == "non_inferiority":
            ok = (mean + m) / se > t
        else:
            ok = ((mean + m) / se > t) & ((m - mean) / se > t)
        out[n] = float(ok.mean())
    return out


def check_against_library(d_SN: np.ndarray, kind: str, m: float, alpha: float, lo_n: int, hi_n: int, rho: float,
                          supported: np.ndarray, used: np.ndarray, k: int = 200) -> None:
    spec = {"kind": kind, "margin": m, "alpha": alpha, "min_seeds": lo_n, "max_seeds": hi_n, "spending": rho}
    for i in range(min(k, d_SN.shape[0])):
        r = hypothesis_state(spec, [(str(j), float(x)) for j, x in enumerate(d_SN[i, :hi_n])])
        if (r["decision"] == SUPPORTED) != bool(supported[i]) or r["seeds_used"] != int(used[i]):
            raise SystemExit(f"{kind}: study {i}: library says {r['decision']} at {r['seeds_used']} seeds, "
                             f"the vectorised rule {bool(supported[i])} at {int(used[i])}")


def bad_seed_scenarios() -> dict[str, "callable"]:
    """name -> draw(rng, shape) of per-seed differences with mean exactly 0 (shifted to a boundary by the caller)."""
    def mixture(q: float, bad: float = -0.09):
        good = -bad * q / (1 - q)

        def draw(rng, shape):
            is_bad = rng.random(shape) < q
            return np.where(is_bad, rng.normal(bad, 0.03, shape), rng.normal(good, 0.015, shape))
        return draw

    def skewed(skew: float, sd: float = 0.02):
        k = (2 / skew) ** 2  # a gamma's skewness is 2 / sqrt(k); flipped: -2 / sqrt(k)

        def draw(rng, shape):
            return -(rng.gamma(k, 1.0, shape) - k) / math.sqrt(k) * sd
        return draw

    return {"gaussian (sd 0.02)": lambda rng, shape: rng.normal(0.0, 0.02, shape),
            "issue's mixture: 10% bad": mixture(0.10), "bad seeds 2%": mixture(0.02), "bad seeds 5%": mixture(0.05),
            "bad seeds 20%": mixture(0.20), "skewness -1": skewed(-1.0), "skewness -2": skewed(-2.0)}


def fixed_type1(d_SN: np.ndarray, kind: str, m: float, alpha: float) -> float:
    """Type-I error of the fixed one-sided t-test (TOST for equivalence) on all of d's seeds."""
    n = d_SN.shape[1]
    mean, se = d_SN.mean(1), d_SN.std(1, ddof=1) / math.sqrt(n)
    se = np.where(se > 0, se, np.inf)
    t = stats.t.ppf(1 - alpha, n - 1)
    if kind == "superiority":
        return float(((mean - m) / se > t).mean())
    if kind == "non_inferiority":
        return float(((mean + m) / se > t).mean())
    return float((((mean + m) / se > t) & ((m - mean) / se > t)).mean())


GRID = (3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 400)


def seeds_needed(draw, rng, kind: str, m: float, nulls, alpha: float, studies: int) -> int | None:
    """The fewest seeds (on GRID) from which on a fixed t-test holds type-I <= alpha + 0.01 at every null and
    every larger grid point (a t-test with very few seeds can hold it by chance: t_{0.95, 1} is 6.3), else None."""
    ok = [all(fixed_type1(draw(rng, (studies, n)) + delta, kind, m, alpha) <= alpha + 0.01 for delta in nulls)
          for n in GRID]
    for i in range(len(GRID)):
        if all(ok[i:]):
            return GRID[i]
    return None


def bad_seed_table(args, rng) -> list[str]:
    lo_n, hi_n, alpha, rho = args.min_seeds, args.max_seeds, args.alpha, args.spending
    lines = ["| scenario | kind | sequential type-I (seeds %d..%d) | fixed t-test at %d seeds | seeds a fixed t-test "
             "needs for <= alpha + 0.01 |" % (lo_n, hi_n, hi_n), "|---|---|---|---|---|"]
    worst = 0.0
    for name, draw in bad_seed_scenarios().items():
        for kind, (m, nulls, _) in KINDS.items():
            errs, fixed = [], []
            for delta in nulls:
                d = draw(rng, (args.studies, hi_n)) + delta
                sup, used = sequential(d, kind, m, alpha, lo_n, hi_n, rho)
                check_against_library(d, kind, m, alpha, lo_n, hi_n, rho, sup, used, k=50)
                errs.append(float(sup.mean()))
                fixed.append(fixed_type1(d, kind, m, alpha))
            need = seeds_needed(draw, rng, kind, m, nulls, alpha, min(args.studies, 4000))
            worst = max(worst, max(errs)) if not name.startswith("gaussian") else worst
            lines.append(f"| {name} | {kind} | {max(errs):.3f}{'' if max(errs) <= alpha + 0.01 else ' TOO HIGH'} "
                         f"| {max(fixed):.3f} | {need if need else '> 400'} |")
    lines.append(f"\nworst sequential type-I error under bad seeds or skew: {worst:.3f} (alpha {alpha})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=10_000, help="simulated studies per scenario")
    ap.add_argument("--problems", type=int, default=500, help="held-out problems per evaluation (MATH500: 500)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--min-seeds", type=int, default=3)
    ap.add_argument("--max-seeds", type=int, default=12)
    ap.add_argument("--spending", type=float, default=1.5, help="rho of alpha * (n / max_seeds)^rho")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bad-seeds", dest="bad_seeds", action="store_false",
                    help="skip the bad-seed and skewed scenarios")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    a_P = np.random.default_rng(args.seed + 1).normal(0.0, DIFFICULTY_SD, args.problems)
    horizon = 3 * args.max_seeds  # seeds simulated per study: the fixed design may need more than the cap
    lo_n, hi_n, alpha, rho = args.min_seeds, args.max_seeds, args.alpha, args.spending
    print(f"{args.studies:,} studies per scenario; {args.problems} problems (base pass@1 "
          f"{expected_pass1(a_P, 0.0):.3f}); alpha {alpha}; seeds {lo_n}..{hi_n}, spending alpha*(n/{hi_n})^{rho:g}")
    rows, failed = [], []
    for kind, (m, nulls, alt) in KINDS.items():
        type1 = []
        for delta in nulls:
            d = simulate(rng, a_P, beta_for(a_P, delta), args.studies, hi_n)
            sup, used0 = sequential(d, kind, m, alpha, lo_n, hi_n, rho)
            check_against_library(d, kind, m, alpha, lo_n, hi_n, rho, sup, used0)
            type1.append((float(sup.mean()), float(used0.mean())))
        d = simulate(rng, a_P, beta_for(a_P, alt), args.studies, horizon)
        sup, used = sequential(d, kind, m, alpha, lo_n, hi_n, rho)
        check_against_library(d, kind, m, alpha, lo_n, hi_n, rho, sup, used)
        power = float(sup.mean())
        curve = fixed_power(d, kind, m, alpha)
        n_fixed = next((n for n, p in curve.items() if p >= power), None)
        err = max(t for t, _ in type1)
        ok = err <= alpha + 0.01
        failed += [] if ok else [kind]
        save = 1 - used.mean() / n_fixed if n_fixed else float("nan")
        rows.append((kind, m, "/".join(f"{x:+.3f}" for x in nulls), err, ok, alt, float(d.std(1, ddof=1).mean()),
                     power, used.mean(), max(u for _, u in type1), n_fixed, save))
    print("\n| kind | margin | null delta | type-I error (<= alpha + 0.01) | alternative delta | sd of d per seed "
          "| power | mean seeds (alternative) | mean seeds (null) | fixed design, equal power | seeds saved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, m, nulls, err, ok, alt, sd, power, en, en0, nf, save in rows:
        print(f"| {kind} | {m:.2f} | {nulls} | {err:.4f} {'ok' if ok else 'TOO HIGH'} | {alt:+.3f} | {sd:.4f} | "
              f"{power:.3f} | {en:.2f} | {en0:.2f} | {nf if nf else f'> {horizon}'} | {save:.0%} |")
    se = math.sqrt(alpha * (1 - alpha) / args.studies)
    print(f"\nMonte Carlo sd of an error rate near alpha: {se:.4f}. {time.perf_counter() - t0:.0f} s on "
          f"{platform.processor() or platform.machine()}, numpy {np.__version__}.")
    if args.bad_seeds:
        print("\nRL's failure modes (per-seed differences at the claim's boundary):\n")
        print("\n".join(bad_seed_table(args, rng)))
    if failed:
        raise SystemExit(f"type-I error above alpha + 0.01 for: {', '.join(failed)}")


if __name__ == "__main__":
    main()
