"""Reward terms: a cell's reward as a weighted sum of named terms (``reward.terms: {name: weight}``), as TRL's
``reward_funcs`` with ``reward_weights`` (each function's reward times its weight, summed per completion).

A term is a registered function of a batch of completions and their gold answers, one signature for all:
``fn(completions, golds, ctx) -> list[float]``, ``ctx`` a :class:`TermContext` (the cell's answer format and
the 1/0 verdicts of its grading, computed once per batch by the outcome regime). Each term declares its
``maximum`` (every shipped term is unit-scaled: at most 1; the weight sets its share of the reward).

Families register themselves, one module each in this package (``@register_term``), imported by
:func:`load_all`: :mod:`~lorarl.rewards.terms.answer` (``correct``, ``integer_answer``) and
:mod:`~lorarl.rewards.terms.xml_format` (``strict_format``, ``soft_format``, ``xml_count``). The outcome
regime deposits the sum on the last completion token, as it deposits its 1/0 grade without terms.

The GSM8K GRPO recipe (paper 000's reading: its reward tops out "just below 4.0", Fig. 3b) is
:data:`GSM8K_RECIPE`: correct 2.0, integer_answer 0.5, strict_format 0.5, soft_format 0.5, xml_count 0.5.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

TermFn = Callable[[Sequence[str], Sequence[str], "TermContext"], list[float]]
GSM8K_RECIPE = {"correct": 2.0, "integer_answer": 0.5, "strict_format": 0.5, "soft_format": 0.5, "xml_count": 0.5}


@dataclass(frozen=True)
class TermContext:
    """What a term may read besides the completion and the gold: the cell's grading, done once per batch."""

    answer_format: str  # reward.answer_format: which text of a completion is its answer
    verdicts: Sequence[float]  # 1/0 per completion: its answer equals the gold under the cell's grading


@dataclass(frozen=True)
class Term:
    name: str  # its `reward.terms` key
    fn: TermFn  # the batch function
    maximum: float  # the largest value it gives one completion (the reward's range is sum weight x maximum)
    summary: str  # one line for docs and errors


TERMS: dict[str, Term] = {}
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_term(name: str, *, maximum: float = 1.0, summary: str = "") -> Callable[[TermFn], TermFn]:
    """Decorator of a term's batch function; the spec is checked here, when its module is imported."""
    def deco(fn: TermFn) -> TermFn:
        if not _NAME.fullmatch(name):
            raise ValueError(f"reward term name {name!r}: lower-case letters, digits and _ only")
        if name in TERMS:
            raise ValueError(f"reward term {name!r} registered twice")
        if not (math.isfinite(maximum) and maximum > 0):
            raise ValueError(f"reward term {name!r}: maximum must be a positive number, got {maximum!r}")
        TERMS[name] = Term(name, fn, float(maximum), summary or (fn.__doc__ or "").strip().splitlines()[0])
        return fn
    return deco


def load_all() -> dict[str, Term]:
    """Import every family module of this package (registration happens at import); name -> term."""
    for mod in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{mod.name}")
    return TERMS


def term_names() -> tuple[str, ...]:
    """The allowed keys of ``reward.terms``, sorted."""
    return tuple(sorted(load_all()))


def check_terms(terms: Mapping[str, float]) -> None:
    """``reward.terms`` names registered terms with finite weights, at least one (else ValueError naming them)."""
    if not terms:
        raise ValueError(f"reward.terms is empty; give at least one term: weight (allowed terms: "
                         f"{', '.join(term_names())}), or null for the regime's own 1/0 reward")
    unknown = sorted(set(terms) - set(term_names()))
    if unknown:
        raise ValueError(f"unknown reward term(s) {', '.join(map(repr, unknown))} in reward.terms; allowed: "
                         f"{', '.join(term_names())}")
    bad = [k for k, w in terms.items() if not math.isfinite(w)]
    if bad:
        raise ValueError(f"reward.terms.{bad[0]}: the weight must be a finite number, got {terms[bad[0]]!r}")


def reward_maximum(terms: Mapping[str, float]) -> float:
    """The largest reward the weighted sum pays one completion (every positive-weight term at its maximum)."""
    registry = load_all()
    return float(sum(w * registry[n].maximum for n, w in terms.items() if w > 0))


def reward_scale(reward_cfg: Any) -> float:
    """The range the policy gradient scales with under ``scale_rewards: none``: the best reward above a wrong
    answer (the terms' maximum; 1 - incorrect_reward for the 1/0 grade). ``train.beta`` weighs the KL term
    against the surrogate as ``beta / reward_scale`` (paper 000: 0.05 / 4.0)."""
    terms = getattr(reward_cfg, "terms", None)
    return reward_maximum(terms) if terms else 1.0 - float(reward_cfg.incorrect_reward)


def score(terms: Mapping[str, float], completions: Sequence[str], golds: Sequence[str],
          ctx: TermContext) -> tuple[list[float], dict[str, list[float]]]:
    """``(sum of weight x term per completion, each term's own values)`` of a batch."""
    registry = load_all()
    n = len(completions)
    per_term = {}
    for name in terms:
        values = [float(v) for v in registry[name].fn(completions, golds, ctx)]
        if len(values) != n:
            raise ValueError(f"reward term {name!r} returned {len(values)} values for {n} completions")
        per_term[name] = values
    totals = [sum(terms[k] * per_term[k][i] for k in terms) for i in range(n)]
    return totals, per_term
