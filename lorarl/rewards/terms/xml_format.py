"""XML format terms of the GSM8K GRPO recipe (its system prompt asks for ``<reasoning>\\n...\\n</reasoning>\\n
<answer>\\n...\\n</answer>``), unit-scaled: the recipe pays 0.5 for each, which ``reward.terms`` weights give.

The patterns are the recipe's, matched from the start of the completion (``re.match``) with ``re.DOTALL``, as
the recipe's later copies match them. The first gist had no ``re.DOTALL``: there ``.`` stops at a newline, the
strict layout (newlines inside the tags) and the soft one (none) exclude each other, and the five terms top out
at 3.5; paper 000's reward "just below 4.0" (Fig. 3b) needs both to fire, so the DOTALL form is the one read."""

from __future__ import annotations

import re
from typing import Sequence

from lorarl.rewards.terms import TermContext, register_term

STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", re.DOTALL)
SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)


@register_term("strict_format", summary="1 if the completion is exactly the recipe's reasoning/answer layout, else 0")
def strict_format(completions: Sequence[str], golds: Sequence[str], ctx: TermContext) -> list[float]:
    """1 if the completion is exactly the recipe's layout (tags on their own lines, a newline at the end), else 0."""
    return [1.0 if STRICT.match(c) else 0.0 for c in completions]


@register_term("soft_format", summary="1 if the completion starts with <reasoning>...</reasoning> then <answer>...</answer>, else 0")
def soft_format(completions: Sequence[str], golds: Sequence[str], ctx: TermContext) -> list[float]:
    """1 if the completion starts with ``<reasoning>...</reasoning>`` followed by ``<answer>...</answer>``, else 0."""
    return [1.0 if SOFT.match(c) else 0.0 for c in completions]


def count_xml(text: str) -> float:
    """The recipe's tag count, times 2 (unit scale): 0.25 per tag written once, less 0.002 per character
    after the closing answer tag."""
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return 2 * count


@register_term("xml_count", summary="0.25 per recipe tag written once, less 0.002 per character after </answer>")
def xml_count(completions: Sequence[str], golds: Sequence[str], ctx: TermContext) -> list[float]:
    """0.25 per recipe tag written once, less 0.002 per character after the closing answer tag (at most 1)."""
    return [count_xml(c) for c in completions]
