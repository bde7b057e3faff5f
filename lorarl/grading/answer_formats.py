"""Text answer rules: which part of a completion is its answer, when it is not the final ``\\boxed{}``.

``reward.answer_format`` (and an evaluation benchmark's ``answer_format``) names one of
:data:`ANSWER_FORMATS`:

* ``boxed`` (default): the final boxed answer, compared with math-verify (:mod:`lorarl.grading.verify`).
* ``answer_line``: DAPO's rule, as verl's ``math_dapo.compute_score`` applies it by default (the rule
  paper 003 trains and scores MATH500/AIME with): only the last 300 characters of the completion are
  read; the answer is the *last* match of ``Answer\\s*:\\s*(.+)`` (case-insensitive, to the end of
  that line); prediction and gold are both normalised by :func:`normalize_final_answer` (the Minerva
  / lm-evaluation-harness normalisation: the part after the last ``=``, units and LaTeX spacing
  removed, ``\\text{}``/``\\boxed{}`` unwrapped, ``\\fracab`` → ``\\frac{a}{b}``, ``$`` dropped,
  thousands commas dropped from plain integers); correct iff the two strings are equal (no symbolic
  comparison: ``0.5`` is not ``\\frac{1}{2}``). No ``Answer:`` line is wrong.
* ``last_number``: verl's GSM8K rule in its ``flexible`` mode (paper 003 grades GSM8K with it): the
  last run of digits, ``.`` and ``,`` (with an optional leading ``-``) that is not just ``.``; correct
  iff it equals the gold text exactly (commas in the completion are kept: ``1,000`` is not ``1000``,
  and a sentence-final ``42.`` is not ``42``, exactly as in verl).
* ``xml_answer``: the widely used GSM8K GRPO recipe's rule (paper 000's reading, ``experiments/kl_free.yaml``):
  the text after the last ``<answer>`` up to the next ``</answer>``, stripped; correct iff it equals the
  gold text exactly (``extract_xml_answer(r) == a``). A completion without ``<answer>`` gives no answer
  (the recipe then compares the whole stripped text, which only a bare gold number equals: kept).
* ``xml_math``: the same ``<answer>`` text graded by math-verify instead of exact text (``14/3``,
  ``\\dfrac{14}{3}`` and ``$\\frac{14}{3}$`` all equal ``\\frac{14}{3}``): the span is graded as one boxed
  answer (a ``\\boxed{}`` inside it as written; a final full stop and whole-span math delimiters dropped, words
  around ``$...$`` math leave its last math part: :func:`span_as_boxed`). No ``<answer>`` tag gives no answer.
* ``hendrycks_boxed``: Evalchemy's AIME/AMC/MATH500 grader (paper 004's evaluation): the last ``\\boxed{}``
  (hendrycks-MATH's ``last_boxed_only_string``), compared with ``is_equiv``, a string normalisation
  without symbolic comparison (:mod:`lorarl.grading.hendrycks_math`).

A format with an answer *span* (:data:`SPANS`: both XML formats) also tells the multiple-choice grader where
the letter is (``<answer>\nD\n</answer>``, :mod:`lorarl.grading.choice`).

The text rules are pure string code (no sympy, no worker process; ``answer_line`` reads at most 300
characters): ``bench/answer_formats.py`` measures them ~100x faster than math-verify's boxed grading.
:mod:`lorarl.grading.verify` dispatches to :func:`verdict` for every format math-verify does not compare
(:data:`MATH_VERIFIED`), so the training reward and every evaluation use this one function.
"""

from __future__ import annotations

import re
from typing import Callable

from lorarl.grading.hendrycks_math import hendrycks_boxed

__all__ = ["ANSWER_FORMATS", "TEXT_RULES", "normalize_final_answer", "answer_line", "last_number",
           "verdict", "has_answer", "INVALID", "xml_answer", "extract_xml_answer", "extracted_answer",
           "MATH_VERIFIED", "SPANS", "xml_span", "span_as_boxed", "bare_span", "RECIPE_READS", "term_answer"]

ANSWER_FORMATS = ("boxed", "answer_line", "last_number", "xml_answer", "xml_math", "hendrycks_boxed")  # boxed = math-verify (lorarl.grading.verify)
MATH_VERIFIED = ("boxed", "xml_math")  # formats math-verify compares (reward.grading / eval grading settings apply)
INVALID = "[INVALID]"  # verl's stand-in for a missing answer (normalised like any prediction)
TAIL_CHARS = 300  # DAPO reads only the end of a completion ("the longest MATH-500 answer has 159 chars")

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_NUMBER = re.compile(r"(-?[0-9.,]+)")

# The Minerva normalisation (Lewkowycz et al. 2022, appendix D.1), the lists as DAPO's reward uses them.
_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
                  ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
            "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
            "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
            "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
            r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots")
_REWRITES = (  # (pattern, replacement), applied in order
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),      # keep the first $...$ span
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),       # \fracab -> \frac{a}{b}
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),              # \sqrta -> \sqrt{a}
)


def normalize_final_answer(text: str) -> str:
    """The Minerva normal form of a final answer (DAPO normalises prediction and gold with it)."""
    text = text.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        text = text.replace(old, new)
    for junk in _REMOVED:
        text = text.replace(junk, "")
    for pattern, repl in _REWRITES:
        text = pattern.sub(repl, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def answer_line(completion: str, gold: str) -> tuple[bool, str | None]:
    """DAPO's verdict: ``(correct, normalised prediction or None when there is no Answer: line)``."""
    hits = _ANSWER_LINE.findall(completion[-TAIL_CHARS:])
    pred = normalize_final_answer(hits[-1] if hits else INVALID)
    return pred == normalize_final_answer(gold), (pred if hits else None)


def last_number(completion: str, gold: str) -> tuple[bool, str | None]:
    """verl's flexible GSM8K verdict: ``(correct, the last number as written or None)``."""
    found = [n for n in _NUMBER.findall(completion) if n not in ("", ".")]
    if not found:
        return False, None
    return found[-1] == gold.strip(), found[-1]


def extract_xml_answer(completion: str) -> str:
    """The GSM8K GRPO recipe's extraction: after the last ``<answer>``, before the next ``</answer>``, stripped."""
    return completion.split("<answer>")[-1].split("</answer>")[0].strip()


def xml_answer(completion: str, gold: str) -> tuple[bool, str | None]:
    """The recipe's verdict: ``(extracted == gold, the extraction or None without an <answer> tag)``."""
    got = extract_xml_answer(completion)
    return got == gold.strip(), (got if "<answer>" in completion else None)


def xml_span(completion: str) -> str | None:
    """The recipe's ``<answer>`` text (:func:`extract_xml_answer`), or None when there is no ``<answer>`` tag."""
    return extract_xml_answer(completion) if "<answer>" in (completion or "") else None


SPANS: dict[str, Callable[[str], str | None]] = {  # formats whose answer is a delimited span of the completion
    "xml_answer": xml_span,
    "xml_math": xml_span,
}


_INLINE_MATH = re.compile(r"\$([^$]+)\$")
_MATH_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))  # whole-span math mode, outermost first


def bare_span(span: str) -> str:
    """A span's answer without the sentence around it: a final full stop (``10.``: an answer ending a sentence;
    no MATH-500 gold ends in one) and math delimiters around the whole span (``$...$``, ``\\[...\\]``,
    ``\\(...\\)``, ``$$...$$``) dropped, repeatedly (``$\\frac{14}{3}$.``)."""
    text = span.strip()
    while True:
        before = text
        text = text.removesuffix(".").strip() if not text.endswith("..") else text
        for left, right in _MATH_DELIMITERS:
            inner = text[len(left):-len(right)]
            if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right) \
                    and left not in inner:  # one math part, not ``$x$ and $y$``
                text = inner.strip()
                break
        if text == before:
            return text


def span_as_boxed(answer_format: str, completion: str) -> str | None:
    """The answer span of a completion as math-verify's boxed input: a ``\\boxed{}`` inside it as written, else
    the span's bare answer (:func:`bare_span`: a final full stop and whole-span math delimiters dropped, as a plain
    gold) in one box, or its last ``$...$`` part when words surround the math; None without a span."""
    span = SPANS[answer_format](completion or "")
    if span is None:
        return None
    if "\\boxed" in span or "\\fbox" in span:
        return span
    text = bare_span(span)
    inline = _INLINE_MATH.findall(text)  # words around math (``The answer is $\\frac{14}{3}$``): its last math part
    return "\\boxed{" + (inline[-1].strip() if inline else text) + "}"


TEXT_RULES: dict[str, Callable[[str, str], tuple[bool, str | None]]] = {
    "answer_line": answer_line,
    "last_number": last_number,
    "xml_answer": xml_answer,
    "hendrycks_boxed": hendrycks_boxed,
}


def verdict(answer_format: str, completion: str, gold: str) -> tuple[bool, str | None]:
    """``(correct, extracted)`` of a completion under a text rule (every format math-verify does not compare)."""
    try:
        rule = TEXT_RULES[answer_format]
    except KeyError:
        raise ValueError(f"answer_format {answer_format!r} is not a text rule; allowed: "
                         f"{', '.join(TEXT_RULES)} ({', '.join(MATH_VERIFIED)} are graded by math-verify)") from None
    return rule(completion or "", str(gold))


def has_answer(answer_format: str, completion: str) -> bool:
    """Does the completion give an answer the format can read (right or wrong)? The training metric
    ``frac_answered``: a boxed answer (boxed), an ``Answer:`` line in the last 300 characters
    (answer_line), a number (last_number), an ``<answer>`` tag (xml_answer, xml_math), a box (hendrycks_boxed)."""
    return extracted_answer(answer_format, completion) is not None


RECIPE_READS: dict[str, Callable[[str], str]] = {  # formats whose reward terms read their recipe's own extraction
    "xml_answer": extract_xml_answer,  # the GSM8K GRPO recipe's: the whole text when there is no <answer> tag
}


def term_answer(answer_format: str, completion: str) -> str | None:
    """The answer a reward term reads: the recipe's own extraction where the format has one (:data:`RECIPE_READS`),
    else :func:`extracted_answer`."""
    read = RECIPE_READS.get(answer_format)
    return read(completion) if read is not None else extracted_answer(answer_format, completion)


def extracted_answer(answer_format: str, completion: str) -> str | None:
    """The answer text the format reads in a completion (the final boxed content for boxed), or None."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format {answer_format!r}; allowed: {', '.join(ANSWER_FORMATS)}")
    if answer_format == "boxed":
        from lorarl.grading.answers import extract_boxed  # here: lorarl.grading.verify imports this module

        return extract_boxed(completion or "")
    if answer_format in SPANS:
        return SPANS[answer_format](completion or "")
    return verdict(answer_format, completion, "")[1]  # the rule's own extraction (None: no answer)
