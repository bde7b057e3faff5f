"""The grading settings a study may write (pure pydantic): the answer formats a field may name
(:data:`AnswerFormat`), a study's changes to math-verify's comparison (:class:`GradingOverride`) and the rule
that they apply to the formats math-verify compares (:func:`check_grading`). Shared by the reward's section
(:mod:`lorarl.rewards.section`) and each benchmark's evaluation settings (:mod:`lorarl.language.config`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lorarl.strict import Strict

AnswerFormat = Literal["boxed", "answer_line", "last_number", "xml_answer", "xml_math", "hendrycks_boxed"]  # = lorarl.grading.answer_formats.ANSWER_FORMATS


class GradingOverride(Strict):
    """A study's changes to a benchmark's math-verify comparison settings (null = the registry's)."""

    float_rounding: int | None = Field(None, ge=0)  # decimal places floats are rounded to (math-verify: 6)
    numeric_precision: int | None = Field(None, ge=1)  # significant digits of numeric equality (15)
    strict: bool | None = None  # false: variables match by position, sets compare with tuples (true)
    allow_set_relation_comp: bool | None = None  # true: a gold set equals a relation, (1,2) = 1<x<2 (false)


def check_grading(grading: GradingOverride, answer_format: str, where: str) -> None:
    """math-verify settings apply to the formats math-verify compares only (a text rule compares strings)."""
    from lorarl.grading.answer_formats import MATH_VERIFIED

    set_ = sorted(grading.model_dump(exclude_none=True))
    if set_ and answer_format not in MATH_VERIFIED:
        raise ValueError(f"{where}.{set_[0]} applies to answer_format {' / '.join(MATH_VERIFIED)} only (math-verify); "
                         f"with answer_format {answer_format!r} leave {where} empty")
