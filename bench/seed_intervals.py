"""The stats table's intervals by simulation: coverage of the 95% intervals and power at the stated MDE.

    python bench/seed_intervals.py [--studies 4000] [--quick]

Each simulated study has two rows (settings) a and b, S seeds each, evaluated greedily on P problems drawn
from a population: problem p is solved with probability sigmoid(d_p + beta_row + w_s + u_row,s), d_p its
difficulty (N(0, 2^2), shared by both rows: one benchmark), w_s a seed effect both rows share (the common
random numbers of one seed: data order, sampling seed, adapter init), u a cell's own training noise. The
truth is the expectation over problems and seeds (Gauss-Hermite): E[sigmoid(beta + N(0, 4 + sw^2 + su^2))].
Scenarios cross S in {2, 3, 5}, P in {30, 200, 500} and three seed-noise regimes: seeds independent
(sw 0, su 0.15), strongly paired (sw 0.4, su 0.1) and problem-dominated (sw 0, su 0.02).

For every study, lorarl.report.stats' two-level interval of each row and of the difference (paired by seed,
as the table does when the rows share their seeds; and unpaired, as for rows whose seeds differ) is
computed in a vectorised copy of the same formulas, checked study by study against
lorarl.report.stats.two_level / compare on the first 50 studies of every scenario. Printed per scenario:
coverage of the row interval and of both difference intervals (95% stated; target >= 94%), the median MDE
of each analysis, and the share of studies that call the difference resolvable when the true difference
equals that median MDE (the MDE's stated power, 80%), with the ratio of the paired to the unpaired MDE.
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np
from scipy import optimize, special, stats

from lorarl.report import stats as lstats

SD_DIFFICULTY = 2.0
REGIMES = {"independent": (0.0, 0.15), "paired": (0.4, 0.1), "problems": (0.0, 0.02)}
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(80)


def expected(beta: float, sd: float) -> float:
    """E[sigmoid(beta + N(0, sd^2))]."""
    return float(np.sum(WEIGHTS * special.expit(beta + sd * NODES)) / math.sqrt(2 * math.pi))


def beta_for(delta: float, sd: float) -> float:
    """beta_a giving E_a - E_b = delta with beta_b = 0."""
    if delta == 0:
        return 0.0
    return optimize.brentq(lambda b: expected(b, sd) - expected(0.0, sd) - delta, -10, 10)


def simulate(rng: np.random.Generator, n: int, S: int, P: int, sw: float, su: float, beta_a: float):
    """[n, S, P] scores of rows a and b."""
    d_NP = rng.normal(0, SD_DIFFICULTY, (n, 1, P))
    w_NS = rng.normal(0, sw, (n, S, 1))
    out = []
    for beta in (beta_a, 0.0):
        u_NS = rng.normal(0, su, (n, S, 1))
        out.append((rng.random((n, S, P)) < special.expit(d_NP + beta + w_NS + u_NS)).astype(np.float64))
    return out


def _parts(x_NSP: np.ndarray) -> list[tuple[np.ndarray, int]]:
    S, P = x_NSP.shape[1:]
    parts = []
    if S > 1:
        parts.append((x_NSP.mean(axis=2).var(axis=1, ddof=1) / S, S - 1))
    parts.append((x_NSP.mean(axis=1).var(axis=1, ddof=1) / P, P - 1))
    return parts


def _interval(mean_N: np.ndarray, parts):
    """(lo, hi, mde): lorarl.report.stats._interval over n studies at once."""
    half = np.sqrt(sum(stats.t.ppf(0.975, d) ** 2 * v for v, d in parts))
    mde = np.sqrt(sum(lstats.power80_factor(d) ** 2 * v for v, d in parts))
    return mean_N - half, mean_N + half, mde


def analyse(a_NSP: np.ndarray, b_NSP: np.ndarray) -> dict[str, tuple]:
    """Vectorised lorarl.report.stats: row a's interval, paired and unpaired differences."""
    S, P = a_NSP.shape[1:]
    mean_a = a_NSP.mean(axis=(1, 2))
    diff = mean_a - b_NSP.mean(axis=(1, 2))
    unpaired = [(m.mean(axis=2).var(axis=1, ddof=1) / S, S - 1) for m in (a_NSP, b_NSP)]
    unpaired.append(((a_NSP.mean(axis=1) - b_NSP.mean(axis=1)).var(axis=1, ddof=1) / P, P - 1))
    return {"row": _interval(mean_a, _parts(a_NSP)), "paired": _interval(diff, _parts(a_NSP - b_NSP)),
            "unpaired": _interval(diff, unpaired)}


def check_against_lorarl(a_NSP, b_NSP, res, k: int = 50) -> None:
    """The vectorised copy equals lorarl.report.stats on the first k studies."""
    seeds = tuple(range(a_NSP.shape[1]))
    other = tuple(range(100, 100 + a_NSP.shape[1]))
    for i in range(min(k, len(a_NSP))):
        ea, eb = lstats.two_level(a_NSP[i], seeds), lstats.two_level(b_NSP[i], seeds)
        assert np.allclose((ea.lo, ea.hi), (res["row"][0][i], res["row"][1][i]), rtol=1e-6, atol=1e-9)
        c = lstats.compare(ea, eb)
        assert c.pairing == "seeds and problems"
        assert np.allclose((c.lo, c.hi, c.mde), [x[i] for x in res["paired"]], rtol=1e-6, atol=1e-9)
        c = lstats.compare(ea, lstats.two_level(b_NSP[i], other))
        assert c.pairing == "problems"
        assert np.allclose((c.lo, c.hi, c.mde), [x[i] for x in res["unpaired"]], rtol=1e-6, atol=1e-9)


def scenario(rng, n: int, S: int, P: int, regime: str) -> dict:
    sw, su = REGIMES[regime]
    sd = math.sqrt(SD_DIFFICULTY ** 2 + sw ** 2 + su ** 2)
    delta0 = 0.05
    beta = beta_for(delta0, sd)
    truth_a = expected(beta, sd)
    a, b = simulate(rng, n, S, P, sw, su, beta)
    res = analyse(a, b)
    check_against_lorarl(a, b, res)
    cover = lambda lo, hi, t: float(np.mean((lo <= t) & (t <= hi)))  # noqa: E731
    row = {"S": S, "P": P, "regime": regime,
           "row": cover(*res["row"][:2], truth_a),
           "paired": cover(*res["paired"][:2], delta0), "unpaired": cover(*res["unpaired"][:2], delta0)}
    for kind in ("paired", "unpaired"):  # power at the true difference = the median stated MDE
        mde = float(np.median(res[kind][2]))
        row[f"mde_{kind}"] = mde
        if mde >= 0.45:  # b sits at 0.5: no a differs by that much (the MDE says "nothing detectable")
            row[f"power_{kind}"] = float("nan")
            continue
        beta = beta_for(mde, sd)
        a, b = simulate(rng, n, S, P, sw, su, beta)
        lo, hi, _ = analyse(a, b)[kind]
        row[f"power_{kind}"] = float(np.mean((lo > 0) | (hi < 0)))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=4000)
    ap.add_argument("--quick", action="store_true", help="S in {2, 3}, P in {30, 200}: the test's subset")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    print(f"# seed_intervals: {args.studies} studies per scenario; {platform.processor() or platform.machine()}, "
          f"numpy {np.__version__}")
    print("| S | P | seeds | row covers | diff paired covers | diff unpaired covers | MDE paired | power at it "
          "| MDE unpaired | power at it | paired / unpaired MDE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 1.0
    for S in ((2, 3) if args.quick else (2, 3, 5)):
        for P in ((30, 200) if args.quick else (30, 200, 500)):
            for regime in REGIMES:
                r = scenario(rng, args.studies, S, P, regime)
                worst = min(worst, r["row"], r["paired"], r["unpaired"])
                print(f"| {S} | {P} | {regime} | {r['row']:.3f} | {r['paired']:.3f} | {r['unpaired']:.3f} "
                      f"| {r['mde_paired']:.3f} | {r['power_paired']:.2f} | {r['mde_unpaired']:.3f} "
                      f"| {r['power_unpaired']:.2f} | {r['mde_paired'] / r['mde_unpaired']:.2f} |", flush=True)
    print(f"\nlowest coverage of a stated 95% interval: {worst:.3f} (target >= 0.94); {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
