"""Hypotheses: one comparison of two settings, tested seed by seed (pure functions).

The observation of seed s is the paired difference d_s = mean over the evaluation problems both cells
of seed s scored of (score_a - score_b) (:func:`paired_difference`; for ``direction: min`` it is
b - a, so a positive d is always "a better"). The seeds join in the study's seed order; a failed seed
(a cell of either setting failed) is skipped and reported, a seed still missing a record holds the
later ones back (so the looks, and the decision, do not depend on which job finished first).

At each look n (lorarl.adaptive.sequential: repeated interval [lo, hi] for the mean difference delta)
the decision of each kind, with ``m`` its margin:

| kind | supported (stop) | refuted (stop: it cannot succeed) |
| --- | --- | --- |
| superiority | lo > m | hi < m |
| non_inferiority | lo > -m | hi < -m |
| equivalence | -m < lo and hi < m | lo > m or hi < -m |

``undecided`` otherwise; ``inconclusive`` once ``max_seeds`` seeds have been spent undecided; a
comparison needs another seed when it is undecided, no record of it is pending and fewer than
``max_seeds`` seeds have been started (a failed seed counts as started: it is replaced, up to the cap);
``censored`` when a setting was stopped by the `search:` block (its final metric is never observed).

**What a claim rests on** (:data:`ASSUMPTION`, in every state and next to every claim in the report): the
per-seed differences are near-Gaussian. RL runs break that in their own way: a few seeds go bad (a collapse,
a divergence) and the differences skew. In bench/adaptive_hypotheses.py the default design (seeds 3..12) keeps
its type-I error within alpha + 0.01 for problem-level Bernoulli data and t(3) tails, but reaches 0.08-0.30
with bad seeds at 2-20% (mean difference on the boundary) or skewness -1 to -2: early looks see no bad seed
yet and a small spread. No rule within ``max_seeds`` fixes that: a fixed t-test needs 96 to more than 400
seeds to hold alpha + 0.01 there. So the design says so when a study loads (:func:`robustness_note`), the
state lists the seeds whose cells diverged or raised a collapse flag (``bad_seeds``, filled by
lorarl.adaptive.ledger), and the report prints each claim with its assumption and those seeds.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from lorarl.adaptive.sequential import critical_value, interval

__all__ = ["paired_difference", "hypothesis_state", "robustness_note", "ASSUMPTION", "FAILED", "SUPPORTED", "REFUTED", "UNDECIDED",
           "INCONCLUSIVE", "CENSORED"]

FAILED = "failed"  # the marker of a failed seed in the observations
SUPPORTED, REFUTED, UNDECIDED, INCONCLUSIVE, CENSORED = "supported", "refuted", "undecided", "inconclusive", "censored"
CLAIMS = {"superiority": ("a is better than b by more than the margin", "a is not better than b by the margin"),
          "non_inferiority": ("a is not worse than b by the margin or more", "a is worse than b by more than the margin"),
          "equivalence": ("a and b differ by less than the margin", "a and b differ by more than the margin")}


ASSUMPTION = ("near-Gaussian per-seed differences: no rare bad seed (a collapse or divergence) among the seeds not "
              "run, no strong skew")
BAD_SEED_ERROR = "0.08-0.30"  # the default design's type-I error under bad seeds (2-20%) or skew (-1, -2): the bench


def robustness_note(name: str, spec: Any) -> str:
    """One line for a study that declares hypothesis ``name``: what its claims assume and what happens when
    RL's seeds break it (bench/adaptive_hypotheses.py; docs/adaptive.md)."""
    sp = _spec(spec)
    return (f"hypotheses.{name}: claims assume {ASSUMPTION}; with seeds going bad at 2-20% or skewed differences "
            f"the default design's type-I error reaches {BAD_SEED_ERROR} (alpha {sp['alpha']:g}), and no rule holds "
            f"alpha + 0.01 within max_seeds {sp['max_seeds']} (a fixed t-test needs 96 to over 400 seeds); seeds "
            f"that diverged or raised a collapse flag are listed beside the claim (docs/adaptive.md)")


def paired_difference(scores_a: Mapping[str, float] | None, scores_b: Mapping[str, float] | None,
                      direction: str = "max") -> float | None:
    """Mean over the problems both score of (a - b) (b - a for ``min``); None without common problems."""
    if not scores_a or not scores_b:
        return None
    common = sorted(set(scores_a) & set(scores_b))
    if not common:
        return None
    sign = 1.0 if direction == "max" else -1.0
    return sign * math.fsum(scores_a[p] - scores_b[p] for p in common) / len(common)


def _verdict(kind: str, lo: float, hi: float, m: float) -> str:
    if kind == "superiority":
        return SUPPORTED if lo > m else REFUTED if hi < m else UNDECIDED
    if kind == "non_inferiority":
        return SUPPORTED if lo > -m else REFUTED if hi < -m else UNDECIDED
    if -m < lo and hi < m:
        return SUPPORTED
    return REFUTED if lo > m or hi < -m else UNDECIDED


def _finite(x: float) -> float | None:
    """JSON has no infinity: an unbounded side (no alpha spent yet at that look) is null."""
    return x if math.isfinite(x) else None


def _spec(spec: Any) -> dict[str, Any]:
    return spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)


def hypothesis_state(spec: Any, observations: Sequence[tuple[str, Any]], censored: bool = False) -> dict[str, Any]:
    """The state of one hypothesis. ``spec``: a HypothesisSpec (or its dict); ``observations``: (seed label,
    d | None (not recorded yet) | FAILED) in seed order. Returns a JSON-able dict: decision, claim,
    estimate and interval at the deciding (else the latest) look, seeds used / started / failed, every
    look, and ``needs_seeds``: how many seeds to add now (0 when none)."""
    sp = _spec(spec)
    kind, m, alpha = sp["kind"], float(sp["margin"]), float(sp["alpha"])
    lo_n, hi_n, rho = int(sp["min_seeds"]), int(sp["max_seeds"]), float(sp["spending"])
    usable: list[tuple[str, float]] = []
    failed = [seed for seed, d in observations if d == FAILED]
    pending = False
    for seed, d in observations:
        if d is None:
            pending = True
            break
        if d != FAILED:
            usable.append((seed, float(d)))
    started = len(observations)  # seeds the study has cells for, recorded or not
    looks: list[dict[str, Any]] = []
    decision, at = UNDECIDED, None
    for n in range(lo_n, min(len(usable), hi_n) + 1):
        c = critical_value(n, lo_n, hi_n, alpha, rho)
        mean, lo, hi = interval([d for _, d in usable[:n]], c)
        looks.append({"n": n, "seed": usable[n - 1][0], "mean": mean, "lower": _finite(lo), "upper": _finite(hi),
                      "critical": _finite(c)})
        v = _verdict(kind, lo, hi, m)
        if v != UNDECIDED:
            decision, at = v, looks[-1]
            break
    if censored:
        decision = CENSORED
    elif decision == UNDECIDED and not pending and (started >= hi_n or len(usable) >= hi_n):
        decision = INCONCLUSIVE
    last = at or (looks[-1] if looks else None)
    need = 0
    if decision == UNDECIDED and not pending:
        need = max(1, lo_n - len(usable))
        need = max(0, min(need, hi_n - started))
    claim = {SUPPORTED: CLAIMS[kind][0], REFUTED: CLAIMS[kind][1]}.get(decision, "")
    return {"kind": kind, "margin": m, "alpha": alpha, "decision": decision, "claim": claim,
            "estimate": last["mean"] if last else None,
            "interval": [last["lower"], last["upper"]] if last else None,
            "seeds_used": last["n"] if last else len(usable), "seeds_started": started,
            "seeds_failed": failed, "pending": pending, "looks": looks, "needs_seeds": need,
            "assumption": ASSUMPTION,
            "design": {"min_seeds": lo_n, "max_seeds": hi_n, "spending": f"alpha * (n / {hi_n}) ** {rho:g}"}}
