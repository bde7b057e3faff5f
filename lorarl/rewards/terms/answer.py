"""Answer terms: is the answer right, is it a whole number (the GSM8K GRPO recipe's correctness and
integer rewards, unit-scaled: the recipe's 2.0 and 0.5 are weights in ``reward.terms``)."""

from __future__ import annotations

from typing import Sequence

from lorarl.grading.answer_formats import term_answer
from lorarl.rewards.terms import TermContext, register_term


@register_term("correct", summary="1 if the answer equals the gold under the cell's grading (reward.answer_format), else 0")
def correct(completions: Sequence[str], golds: Sequence[str], ctx: TermContext) -> list[float]:
    """1 if the answer equals the gold under the cell's grading (``reward.answer_format``), else 0."""
    return [1.0 if v else 0.0 for v in ctx.verdicts]


@register_term("integer_answer", summary="1 if the answer the format reads is digits only (str.isdigit), else 0")
def integer_answer(completions: Sequence[str], golds: Sequence[str], ctx: TermContext) -> list[float]:
    """1 if the answer the format reads is digits only (the recipe's ``str.isdigit``), else 0. Under
    ``xml_answer`` the recipe's own extraction, which reads the whole text when there is no ``<answer>`` tag
    (lorarl.grading.answer_formats.term_answer)."""
    return [1.0 if (got := term_answer(ctx.answer_format, c)) is not None and got.isdigit() else 0.0
            for c in completions]
