"""Outcome reward: 1 if the completion's answer equals the gold answer, else 0.

The answer is the final boxed answer compared with math-verify (``reward.answer_format: boxed``,
under the ``reward.grading`` settings), or a text rule (DAPO's last ``Answer:`` line, the last
number: :mod:`lorarl.grading.answer_formats`); evaluation grades with the same
:func:`lorarl.grading.verify.score_math_batch` and settings, so a completion gets one verdict in both stages.

Grading runs in lorarl.grading.verify's timed worker pool: a parse error or a pathological answer gives 0,
never a crash and never more than `timeout_s` per completion.

* :class:`OutcomeDeposits` is the ``outcome`` regime: that same value deposited on the last
  completion token (the group-normalised reward-to-go of a single last-token deposit is TRL's GRPO
  advantage on every token). With ``reward.terms`` the deposit is the terms' weighted sum instead
  (:mod:`lorarl.rewards.terms`: TRL's ``reward_funcs`` with ``reward_weights``), the grade still being
  the accuracy metric and the ``correct`` term.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from pydantic import Field, field_validator, model_validator

from lorarl.grading.answers import answer_text, gold_boxes, gsm8k_gold
from lorarl.grading.verify import GradingSettings, score_math_batch
from lorarl.rewards import Deposits, Rollouts, register_regime
from lorarl.rewards.section import RewardSection


class OutcomeSection(RewardSection):
    """``reward:`` of ``regime: outcome``: what a wrong answer pays, or the terms that replace the 1/0 grade."""

    incorrect_reward: float = Field(0.0, le=0)  # reward of a wrong/missing answer (right = 1); DAPO's rule: -1 (changes the overlong penalty's relative weight)
    terms: dict[str, float] | None = Field(None, json_schema_extra={"signature_omits_default": True})  # the reward as a weighted sum of registered terms, name: weight (TRL's reward_funcs + reward_weights; lorarl.rewards.terms), deposited as the 1/0 grade is; null = the 1/0 grade (paper 000's reading: the GSM8K GRPO recipe, max 4.0)

    @field_validator("terms")
    @classmethod
    def _known_terms(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        from lorarl.rewards.terms import check_terms  # imports every term family (light)

        if v is not None:
            check_terms(v)
        return v

    @model_validator(mode="after")
    def _terms_replace_the_grade(self) -> "OutcomeSection":
        if self.terms is not None and self.incorrect_reward != 0:
            raise ValueError(f"reward.terms replaces the 1 / incorrect_reward grade by the terms' weighted sum; allowed "
                             f"with terms: incorrect_reward 0 (got {self.incorrect_reward})")
        return self


def gold_answer(raw: str) -> str:
    """The gold answer of a dataset row: GSM8K's ``#### x`` → x; a MATH solution → all its boxed
    answers (distinct, in order, joined with ``,``: a multi-answer solution boxes each answer)."""
    raw = str(raw)
    if "####" in raw:
        return gsm8k_gold(raw)
    boxed = answer_text(gold_boxes(raw)) if "boxed" in raw or "fbox" in raw else None
    return boxed if boxed is not None else raw.strip()


def settings_of(reward_cfg: Any) -> GradingSettings:
    """The grading settings of a cell's ``reward:`` section (format + math-verify overrides)."""
    return GradingSettings(answer_format=reward_cfg.answer_format,
                           **reward_cfg.grading.model_dump(exclude_none=True))


def grade(completions: Sequence[str], answers: Sequence[str], timeout_s: float = 5.0,
          settings: GradingSettings | None = None) -> list[float]:
    """1.0 / 0.0 per completion: is its answer the gold answer (dataset column, see gold_answer)?"""
    scores = score_math_batch([gold_answer(a) for a in answers], list(completions), timeout_s, settings)
    return [1.0 if s.correct else 0.0 for s in scores]


class OutcomeDeposits:
    """The ``outcome`` regime: one deposit on the last completion token: 1 for a right answer,
    ``incorrect`` (``reward.incorrect_reward``: 0, DAPO's -1) for a wrong or missing one.

    ``score_fn(completions, answers) -> list[float]`` replaces math-verify grading (tests use it).
    """

    name = "outcome"
    needs_student_logps = False
    needs_gold = True  # it grades against the gold answer
    reports_accuracy = True  # its 1/0 grade is the accuracy metric

    def __init__(self, timeout_s: float = 5.0,
                 score_fn: Callable[[list[str], list[str]], list[float]] | None = None,
                 settings: GradingSettings | None = None, incorrect: float = 0.0,
                 terms: dict[str, float] | None = None):
        self.timeout_s = timeout_s
        self.score_fn = score_fn
        self.settings = settings  # answer format + math-verify settings (None = boxed, defaults)
        self.incorrect = float(incorrect)  # reward of a wrong answer (DAPO: -1)
        self.terms = dict(terms) if terms else None  # reward.terms: name -> weight (None: the 1/0 grade)
        self.last_correct: list[float] = []  # 1/0 verdicts of the last batch (the accuracy metric)
        self.last_terms: dict[str, list[float]] = {}  # each term's values on the last batch (logged as reward_terms/<term>)

    def deposits(self, rollouts: Rollouts) -> Deposits:
        if rollouts.answers is None:
            raise ValueError("the outcome regime needs the gold answers (dataset column `answer`)")
        if self.score_fn is not None:
            scores = [float(s) for s in self.score_fn(list(rollouts.completions), list(rollouts.answers))]
        else:
            scores = grade(rollouts.completions, rollouts.answers, self.timeout_s, self.settings)
        self.last_correct = list(scores)  # the grade (1/0; a score_fn may grade in between)
        if self.terms:
            from lorarl.rewards.terms import TermContext, score

            golds = [gold_answer(a) for a in rollouts.answers]
            fmt = self.settings.answer_format if self.settings is not None else "boxed"
            scores, self.last_terms = score(self.terms, list(rollouts.completions), golds, TermContext(fmt, scores))
        else:
            scores = [self.incorrect + (1.0 - self.incorrect) * s for s in scores]  # 1 -> 1, 0 -> incorrect
        # An empty completion still deposits (at position 0, outside its mask) so that, as in TRL, its
        # reward counts in the group statistics while it has no token to train.
        positions = [[max(len(ids) - 1, 0)] for ids in rollouts.completion_ids]
        return Deposits(positions, [[s] for s in scores], dense=False)


def reward_range(cfg: Any) -> tuple[float, float]:
    """A completion's reward before overlong shaping: a right answer pays 1, a wrong one
    ``reward.incorrect_reward`` (or 0 if above); a ``reward.terms`` sum at most every term's maximum, no floor
    (a term such as XML count can go below zero)."""
    terms = cfg.terms
    if terms:
        from lorarl.rewards.terms import reward_maximum

        return -math.inf, reward_maximum(terms)
    return min(float(cfg.incorrect_reward), 0.0), 1.0


@register_regime("outcome", section=OutcomeSection, reward_range=reward_range)
def build(cfg: Any, tokenizer: Any, *, resolve: Any = None, device: str = "cpu",
          temperature: float = 1.0) -> OutcomeDeposits:
    """``reward.regime: outcome``: math-verify (or the answer format's rule) under ``reward.grading``."""
    return OutcomeDeposits(timeout_s=cfg.grading_timeout_s, settings=settings_of(cfg), incorrect=cfg.incorrect_reward,
                           terms=cfg.terms)
