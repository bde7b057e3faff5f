"""The range a table column can take, so that an interval never claims values the metric cannot have.

With two seeds a Student-t 95% interval is mean ± 12.7 sd/√2: a train reward of 0.45 and 0.75 gives
[-1.3, 2.5] for a reward that lives in [0, 1]. The stats table clips each t interval to its column's range
where the column is bounded (``clip``), and the evaluation columns' two-level intervals to [0, 1]. A clipped
end is then the range's end, not an estimate: the interval still covers what the t interval covers.

* evaluation columns (``<benchmark>/pass@k``, ``avg@k``): [0, 1];
* times (``*_time_s``, ``*_s``): [0, ∞);
* the train reward: the reward regime's range where its spec knows it (``RegimeSpec.reward_range``;
  ``outcome``: a right answer pays 1, a wrong one ``reward.incorrect_reward``, DAPO's overlong shaping adds down to ``-overlong_factor``; with
  ``reward.terms``, at most the terms' weighted maximum, e.g. 4.0 for paper 000's recipe, and no floor); none for
  the dense regimes (process, distillation: unbounded sums) or a reward section with settings this rule does
  not know (``REWARD_FIELDS``). A range contradicted by an observed value is not used.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from lorarl.report.columns import EVAL_COL

Bounds = tuple[float, float]

# the reward settings the outcome range below was written against (only `incorrect_reward` moves it; the others
# grade or configure other regimes); a study that sets a reward field outside this list (a new way of paying)
# gets no train-reward range until this rule learns it
REWARD_FIELDS = frozenset({
    "regime", "grading_timeout_s", "answer_format", "grading", "incorrect_reward", "step_separator", "prm",
    "rule_check", "prm_model", "prm_step_tag", "prm_good_token", "prm_bad_token", "prm_device", "prm_batch_size",
    "prm_max_length", "teacher", "teacher_device", "teacher_dtype", "teacher_batch_size", "terms"})


def outcome_bounds(cfg: Any) -> Bounds | None:
    """The range of one cell's per-completion train reward (see the module doc), or None if unknown."""
    from lorarl.rewards.registry import spec_of  # the regime's range (lorarl.rewards.RegimeSpec.reward_range)

    r = cfg.reward
    known = spec_of(r.regime).reward_range(r)
    if known is None or set(r.model_fields_set) - REWARD_FIELDS:
        return None
    t = cfg.train
    shaping = float(t.overlong_factor) if t.overlong_buffer else 0.0
    return known[0] - shaping, known[1]


def reward_bounds(configs: Iterable[Any]) -> Bounds | None:
    """The union of the cells' train-reward ranges; None if any cell's is unknown."""
    out: Bounds | None = None
    for cfg in configs:
        b = outcome_bounds(cfg)
        if b is None:
            return None
        out = b if out is None else (min(out[0], b[0]), max(out[1], b[1]))
    return out


def column_bounds(col: str, configs: Iterable[Any]) -> Bounds | None:
    """The range of a table column (see the module doc), or None where it is unbounded or unknown."""
    if EVAL_COL.match(col):
        return 0.0, 1.0
    if col.endswith("_s"):
        return 0.0, math.inf
    if col == "final_train_reward":
        return reward_bounds(configs)
    return None


def consistent(bounds: Bounds | None, values: Iterable[float]) -> Bounds | None:
    """``bounds`` unless an observed value lies outside them (then the range is not this column's)."""
    if bounds is None:
        return None
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return bounds if all(bounds[0] - 1e-9 <= v <= bounds[1] + 1e-9 for v in vals) else None


def clip(lo: float, hi: float, bounds: Bounds | None) -> tuple[float, float]:
    """An interval clipped to a range (NaN ends stay NaN)."""
    if bounds is None or math.isnan(lo) or math.isnan(hi):
        return lo, hi
    return max(lo, bounds[0]), min(hi, bounds[1])
