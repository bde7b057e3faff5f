"""Multiple-choice grading: the answer letter of a completion (boxed, "answer is X", or a lone letter).

Under an answer format with a span (:data:`lorarl.grading.answer_formats.SPANS`: the GSM8K GRPO recipe's
``<answer>...</answer>``, paper 000) the letter is read inside the span first: a lone letter (``D``, ``(D)``,
``D) electron``, ``**D**``, ``[D]``, ``Option D``), a boxed one or "the answer is D" there; a span without a letter
is then matched to the problem's choices (the option's text, ``<answer>electron</answer>``, ``The answer is
electron.``, ``2.5`` for ``2.50 eV``:
:mod:`lorarl.grading.option_text`; exactly one choice or no answer); a span read neither way (or no span) leaves the
whole completion to the boxed / "answer is X" rules."""

from __future__ import annotations

import re
from typing import Sequence

from lorarl.grading.answer_formats import SPANS
from lorarl.grading.answers import extract_boxed
from lorarl.grading.option_text import option_letter
from lorarl.grading.verify import Score


_FILL = r"[\s*$:\-(\[{]*"   # markdown bold, $, colons, an opening bracket before the letter
_LETTER_PATTERNS = [   # the letter must be upper case: "the answer is a bit..." is no answer
    re.compile(r"(?i:answer)[\s*$]*(?i:is|:)" + _FILL + r"([A-Z])(?![A-Za-z])"),
    re.compile(r"(?i:(?:correct|best)\s+(?:option|choice)\s+is)" + _FILL + r"([A-Z])(?![A-Za-z])"),
]
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")


def _letter_of(s: str, letters: str) -> str | None:
    """A single option letter from a short answer like ``C``, ``(C)``, ``\\text{C}``, ``C) 4``."""
    s = _TEXT_CMD.sub(r"\1", s).strip().strip("$ ")
    m = re.fullmatch(r"\(?\s*([A-Za-z])\s*\)?(?:[.:)]\s*.*)?", s, re.DOTALL)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    return None


_SPAN_WRAP = re.compile(r"^(?i:(?:the\s+)?(?:answer|option|choice)\s*(?:is\s*)?:?\s*)?[*_\[]*\s*(.*?)\s*[*_\]]*\.?$", re.DOTALL)


def _span_letter(span: str, letters: str) -> str | None:
    """The letter an answer span holds on its own: a short answer (:func:`_letter_of`), also in markdown bold,
    in square brackets or after "Option" / "Choice" / "Answer:" (``**D**``, ``[D]``, ``Option D``)."""
    text = span.strip()
    m = _SPAN_WRAP.match(text)
    return _letter_of(text, letters) or (_letter_of(m.group(1), letters) if m else None)


def _span_option(span: str, choices: Sequence[str], letters: str) -> str | None:
    """The one choice the span's text is (:func:`lorarl.grading.option_text.option_letter`), also after "The answer
    is" / "Answer:" (``The answer is electron.``)."""
    m = _SPAN_WRAP.match(span.strip())
    return option_letter(span, choices, letters) or (option_letter(m.group(1), choices, letters) if m else None)


def _letter_in(text: str, letters: str) -> str | None:
    """The letter of the last ``\\boxed{...}`` when there is one, else of the last "answer is X" phrase."""
    boxed = extract_boxed(text)
    letter = _letter_of(boxed, letters) if boxed is not None else None
    if letter is None and text:
        plain = _TEXT_CMD.sub(r"\1", text)
        for pattern in _LETTER_PATTERNS:
            hits = [m.group(1) for m in pattern.finditer(plain)]
            hits = [h for h in hits if h in letters]
            if hits:
                return hits[-1]
    return letter


def score_choice(gold_letter: str, completion: str, letters: str = "ABCD", answer_format: str = "boxed",
                 choices: Sequence[str] | None = None) -> Score:
    """Grade a multiple-choice completion by letter.

    The letter comes from the answer span of ``answer_format`` when it has one (see the module doc; ``choices``,
    the options in the order the prompt showed them, let the span's option text count), else from the last
    ``\\boxed{...}`` when there is one, otherwise from the last phrase like "the answer is (C)" / "Answer: C".
    Nothing else in the text is used.
    """
    gold = gold_letter.strip().strip("()").upper()
    span_of = SPANS.get(answer_format)
    span = span_of(completion or "") if span_of is not None else None
    letter = (_span_letter(span, letters) or _letter_in(span, letters)
              or (_span_option(span, choices, letters) if choices else None)) if span else None
    if letter is None:
        letter = _letter_in(completion or "", letters)
    return Score(letter is not None and letter == gold, letter, False)
