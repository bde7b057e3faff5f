"""Evaluation protocols and their arithmetic.

* greedy pass@1: temperature 0, one completion per problem, mean correctness;
* avg@k: mean correctness over the k samples of each problem, averaged over problems (an unbiased
  estimate of pass@1);
* pass@k: the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` per problem (n samples, c correct),
  averaged over problems.  It equals "any of n correct" only when ``k == n``.

Intervals are 95% Wilson score intervals over problems (one seed): each problem is one trial whose
score is its per-problem metric.  For fractional per-problem scores (avg@k, pass@k with k < n) the
variance is at most ``p(1-p)``, so the binomial interval is conservative.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Protocol", "Metric", "pass_at_k", "per_problem_pass_at_k", "avg_at_k",
           "greedy_pass_at_1", "mean_pass_at_k", "wilson_interval", "summarize"]

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples of which ``c`` are correct.

    ``1 - C(n-c, k)/C(n, k)`` computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which never forms
    the (huge) binomial coefficients.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _check_rows(correct: Sequence[Sequence[bool]]) -> None:
    if len(correct) == 0:
        raise ValueError("no problems")
    if any(len(row) == 0 for row in correct):
        raise ValueError("a problem has no samples")


def per_problem_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> list[float]:
    """pass@k of each problem (rows = problems, columns = samples; rows may differ in length)."""
    _check_rows(correct)
    return [pass_at_k(len(row), sum(bool(x) for x in row), k) for row in correct]


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """Unbiased pass@k averaged over problems."""
    vals = per_problem_pass_at_k(correct, k)
    return sum(vals) / len(vals)


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """avg@k: per-problem mean correctness over its samples, averaged over problems."""
    _check_rows(correct)
    return sum(sum(bool(x) for x in row) / len(row) for row in correct) / len(correct)


def greedy_pass_at_1(correct: Sequence[bool]) -> float:
    """Fraction of problems whose single greedy completion is correct."""
    if len(correct) == 0:
        raise ValueError("no problems")
    return sum(bool(x) for x in correct) / len(correct)


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` trials (successes may be fractional)."""
    if n <= 0:
        raise ValueError("n must be positive")
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside [0, {n}]")
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


class Protocol(BaseModel):
    """How a benchmark is sampled and which metrics are reported.

    ``kind="greedy"``: temperature 0, ``n = 1``, metric ``pass@1``.
    ``kind="sample"``: ``n`` samples at ``temperature``/``top_p``; metrics ``avg@n`` and
    ``pass@k`` for each ``k`` in ``ks`` (default ``(n,)``, the PEFT study's Avg/Pass table).
    ``kind`` is inferred from the temperature when omitted.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["greedy", "sample"] = "greedy"  # decoding family
    temperature: float = Field(0.0, ge=0)  # sampling temperature (0 = greedy)
    top_p: float = Field(1.0, gt=0, le=1)  # nucleus sampling mass
    max_new_tokens: int = Field(4096, gt=0)  # completion budget (longer = truncated)
    n: int = Field(1, ge=1)  # samples per problem
    ks: tuple[int, ...] = (1,)  # k values of the reported pass@k

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "kind" not in data:
                data["kind"] = "greedy" if not data.get("temperature") else "sample"
            if "ks" not in data:
                data["ks"] = (1,) if data["kind"] == "greedy" else (int(data.get("n", 1)),)
        return data

    @model_validator(mode="after")
    def _check(self) -> "Protocol":
        if self.kind == "greedy":
            if self.temperature != 0 or self.n != 1 or self.ks != (1,):
                raise ValueError("greedy protocols need temperature 0, n 1 and ks (1,)")
        elif self.temperature <= 0:
            raise ValueError("sampling protocols need temperature > 0")
        if not self.ks or list(self.ks) != sorted(set(self.ks)):
            raise ValueError(f"ks must be non-empty, increasing and unique, got {self.ks}")
        if self.ks[0] < 1 or self.ks[-1] > self.n:
            raise ValueError(f"every k must lie in [1, n={self.n}], got {self.ks}")
        return self

    @classmethod
    def greedy(cls, max_new_tokens: int = 4096) -> "Protocol":
        """Greedy pass@1."""
        return cls(kind="greedy", max_new_tokens=max_new_tokens)

    @classmethod
    def sampling(cls, n: int, temperature: float = 0.6, top_p: float = 0.95,
                 max_new_tokens: int = 32768, ks: Sequence[int] | None = None) -> "Protocol":
        """avg@n and pass@k (default k = n) from n samples per problem."""
        return cls(kind="sample", n=n, temperature=temperature, top_p=top_p,
                   max_new_tokens=max_new_tokens, ks=tuple(ks) if ks else (n,))

    @property
    def metric_names(self) -> list[str]:
        """Names of the reported metrics, primary first."""
        if self.kind == "greedy":
            return ["pass@1"]
        return [f"avg@{self.n}"] + [f"pass@{k}" for k in self.ks]

    @property
    def primary_metric(self) -> str:
        """The headline metric (the study tables' main column)."""
        return self.metric_names[0]


@dataclass(frozen=True)
class Metric:
    """One reported number with its 95% interval over problems."""

    name: str
    value: float
    ci_low: float
    ci_high: float
    n_problems: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _metric(name: str, per_problem: list[float]) -> Metric:
    n = len(per_problem)
    total = math.fsum(per_problem)
    lo, hi = wilson_interval(min(max(total, 0.0), float(n)), n)
    return Metric(name, total / n, lo, hi, n)


def summarize(correct: Sequence[Sequence[bool]], protocol: Protocol) -> dict[str, Metric]:
    """All metrics of ``protocol`` from a problems x samples correctness matrix.

    Every problem must have at least ``max(ks)`` samples; greedy uses the first sample.
    """
    _check_rows(correct)
    out: dict[str, Metric] = {}
    if protocol.kind == "greedy":
        out["pass@1"] = _metric("pass@1", [float(bool(row[0])) for row in correct])
        return out
    short = [len(r) for r in correct if len(r) < protocol.ks[-1]]
    if short:
        raise ValueError(f"{len(short)} problems have fewer than {protocol.ks[-1]} samples")
    out[f"avg@{protocol.n}"] = _metric(
        f"avg@{protocol.n}", [sum(bool(x) for x in r) / len(r) for r in correct])
    for k in protocol.ks:
        out[f"pass@{k}"] = _metric(f"pass@{k}", per_problem_pass_at_k(correct, k))
    return out
