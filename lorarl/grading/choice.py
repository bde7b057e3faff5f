"""Multiple-choice grading: the answer letter of a completion (boxed, "answer is X", or a lone letter)."""

from __future__ import annotations

import re

from lorarl.grading.answers import extract_boxed
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


def score_choice(gold_letter: str, completion: str, letters: str = "ABCD") -> Score:
    """Grade a multiple-choice completion by letter.

    The letter comes from the last ``\\boxed{...}`` when there is one, otherwise from the last
    phrase like "the answer is (C)" / "Answer: C".  Nothing else in the text is used.
    """
    gold = gold_letter.strip().strip("()").upper()
    boxed = extract_boxed(completion)
    letter = _letter_of(boxed, letters) if boxed is not None else None
    if letter is None and completion:
        plain = _TEXT_CMD.sub(r"\1", completion)
        for pattern in _LETTER_PATTERNS:
            hits = [m.group(1) for m in pattern.finditer(plain)]
            hits = [h for h in hits if h in letters]
            if hits:
                letter = hits[-1]
                break
    return Score(letter is not None and letter == gold, letter, False)
