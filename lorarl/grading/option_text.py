"""The letter of a multiple-choice answer written as the option's text (``<answer>electron</answer>``).

A policy trained to put the answer itself in an answer span (the GSM8K GRPO recipe's ``<answer>``, paper 000)
often writes the option, not its letter.  :func:`option_letter` matches the span's text to the problem's choices:

1. exact text after normalisation (:func:`normal_text`: case, whitespace, ``$``, ``\\text{}``/``\\mathrm{}``,
   LaTeX spacing, surrounding punctuation and markdown dropped);
2. failing that, numbers (:func:`numeric`): the same value (``2.5`` = ``2.50``, ``2.5e-3`` = ``2.5 \\times 10^{-3}``)
   and the same unit where both state one (``2.5`` matches ``2.50 eV``; ``2.5 eV`` does not match ``2.5 meV``).
   The "unit" is whatever follows the number, so a bare number also matches an option that goes on after it
   (``3`` for ``3 and 4``) when no other option starts with that value.

A span matching two choices (or none) at the first rule that matches any gives no letter.  Only the answer span is
read (:mod:`lorarl.grading.choice`): a study graded on boxed letters is unchanged.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Sequence

__all__ = ["option_letter", "normal_text", "numeric"]

_TEXT_CMD = re.compile(r"\\(?:text|textrm|textbf|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_LATEX_SPACE = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad|\\left|\\right")
_EDGE = " \t\n$.,;:!?*_\"'`"   # surrounding math delimiters, sentence punctuation, markdown, quotes
_NUMBER = re.compile(r"([-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+))(?:e([-+]?\d+))?"
                     r"(?:(?:\\times|\\cdot|x|\*)10\^\{?([-+]?\d+)\}?)?(.*)", re.DOTALL)


def normal_text(text: str) -> str:
    """The comparable form of an answer or an option: lower case, no whitespace, LaTeX text commands unwrapped,
    LaTeX spacing, ``\\left``/``\\right`` and ``$`` dropped, punctuation/markdown at either end stripped."""
    s = text
    while True:
        before = s
        s = _TEXT_CMD.sub(r"\1", s)
        if s == before:
            break
    s = _LATEX_SPACE.sub("", s)
    s = re.sub(r"\s+", "", s).replace("$", "").strip(_EDGE)
    return s.lower()


def numeric(text: str) -> tuple[Decimal, str] | None:
    """``(value, unit)`` of a normalised answer that starts with a number (thousands commas, ``e-3`` and
    ``\\times 10^{-3}`` read; the unit is the text after it, ``""`` when none), else None (also when digits go
    on after the number: ``1,2`` is a pair, not 1 and a unit)."""
    m = _NUMBER.fullmatch(text)
    if m is None:
        return None
    mantissa, e1, e2, unit = m.groups()
    if unit[:1] in tuple("0123456789,.^"):  # digits go on (``1,2``, ``2.5.1``, ``10^x``): no number + unit
        return None
    try:
        value = Decimal(mantissa.replace(",", "")) * Decimal(10) ** int(e1 or e2 or 0)
    except InvalidOperation:
        return None
    return value, unit.strip(_EDGE)


def _same_number(a: tuple[Decimal, str], b: tuple[Decimal, str]) -> bool:
    return a[0] == b[0] and (not a[1] or not b[1] or a[1] == b[1])


def option_letter(span: str, choices: Sequence[str], letters: str) -> str | None:
    """The letter of the one choice the span's text is (see the module doc), or None (no match, or several)."""
    got = normal_text(span)
    if not got:
        return None
    keys = [normal_text(c) for c in choices[: len(letters)]]
    hits = [i for i, k in enumerate(keys) if k == got]
    if not hits:
        value = numeric(got)
        if value is not None:
            hits = [i for i, k in enumerate(keys) if (v := numeric(k)) is not None and _same_number(value, v)]
    return letters[hits[0]] if len(hits) == 1 else None
