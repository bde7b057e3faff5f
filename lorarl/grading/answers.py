"""Which text of a completion or a gold is graded, and how digit separators are read.

Pure string code (no sympy, no math-verify), shared by :mod:`lorarl.grading.verify` (outcome reward and
benchmark scores) and the benchmark converters.  The rules follow math-verify 0.9.0 called on the
whole text (``latex2sympy2_extended.math_normalization.extract_boxed_content(mode="last")``, which
``math_verify.parse`` applies to a ``\\boxed{...}`` match):

* **Completion**: the grader hands :func:`prepare_completion`'s text to math-verify's own boxed
  patterns (``math_verify.parser.lazy_latex_regex``, the boxed-priority pair): matches are tried
  from the one ending last, the first that parses is the answer.  A match is either a math
  environment holding a box (``$...$``, ``$$...$$``, ``\\[...\\]``, ``\\(...\\)``), chained to up
  to five earlier ones by ``and``/``or``/``,`` (every box inside them counts), or the plain
  ``\\boxed{...}`` run, read by :func:`final_boxed`'s rule: the last complete box plus every box
  before it that is *adjacent*, walking leftwards: the text between the two is shorter than 10
  characters, or shorter than 70 characters, contains ``and``/``or``/``,``/``;`` and the two
  contents differ; the first box that is not adjacent ends the answer.  So boxed intermediate
  results separated from the final box by prose are not graded, ``\\boxed{1} and \\boxed{2}`` or
  ``$x=\\boxed{1}$, $x=\\boxed{2}$`` is the set {1, 2}, and of ``$a=\\boxed{3}$, so
  $a+b=\\boxed{7}$`` only the last environment counts (without the ``$``, the 10-70 character rule
  joins all three).  Several boxes are graded as the set of their contents (joined with ``,``).
  Consecutive identical contents count once; ``\\boxed{\\boxed{8}}`` is ``8``.  Only boxed text is
  graded (no box: no grade; math-verify's unboxed "answer is ..." patterns are never used), and a
  trailing unclosed ``\\boxed{`` (a truncated completion) is cut off before matching.
* **Gold** (:func:`gold_boxes`): a reference solution keeps *all* its boxes (innermost contents, in
  order, duplicates once), joined with ``,``: a multi-answer MATH solution boxes each answer.
* **Digit separators** (:func:`normalize_separators`, applied to gold and answer before parsing):
  thin/medium/thick spaces (``\\,`` ``\\:`` ``\\;`` ``\\>`` ``\\ `` ``~`` ``\\thinspace``), Unicode
  thin/no-break spaces and plain spaces between digit groups of three (``1\\,000``, ``1 000 000``,
  ``3.141\\,592``) are removed; ``{,}`` (LaTeX's comma without spacing) is a thousands separator
  between groups of three (``1{,}000``) and a decimal comma otherwise (``2{,}5`` = 2.5).  A plain
  comma is left to math-verify: ``1,000`` is one thousand, ``1,2,3`` and ``2,5`` stay lists.
"""

from __future__ import annotations

import re

__all__ = ["extract_boxed", "boxed_spans", "final_boxed", "gold_boxes", "answer_text",
           "normalize_separators", "prepare_completion"]

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FBOX = re.compile(r"\\fbox(?=\s*\{)")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)   # escaped pairs (\{, \\, \b...) or braces
_SEPARATOR_WORDS = re.compile(r"\b(and|or)\b|,|;")  # math-verify's VALID_SEPARATOR_PATTERN
_NEAR = 10   # math-verify: boxes closer than this many characters always join
_FAR = 70    # ... and closer than this join when a separator word lies between (different contents)


def boxed_spans(text: str | None) -> list[tuple[int, int, int]]:
    """``(command_start, content_start, content_end)`` of every complete box, by command start.

    Braces balance in one linear pass; escaped braces (``\\{``) do not count, so degenerate
    outputs (thousands of ``\\boxed{``) cost milliseconds.  ``content_end`` is the closing brace.
    """
    if not text:
        return []
    openers = {m.end() - 1: m.start() for m in _BOXED_RE.finditer(text)}
    if not openers:
        return []
    stack: list[int] = []
    spans: list[tuple[int, int, int]] = []
    for m in _BRACE_TOKENS.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append(m.start())
        elif tok == "}" and stack:
            start = stack.pop()
            if start in openers:
                spans.append((openers[start], start + 1, m.start()))
    spans.sort()
    return spans


def extract_boxed(text: str | None) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), stripped; ``None`` if none.

    "Last" is the latest opening among the complete ones: a trailing unterminated ``\\boxed{`` is
    skipped and ``\\boxed{\\boxed{8}}`` gives ``8``.  Multiple-choice letters use this; math answers
    use :func:`final_boxed`.
    """
    spans = boxed_spans(text)
    if not spans:
        return None
    _, a, b = spans[-1]
    return text[a:b].strip()  # type: ignore[index]


def final_boxed(text: str | None) -> list[str]:
    """The boxes of a completion's final answer, in text order (see the module rules)."""
    spans = boxed_spans(text)
    if not spans:
        return []
    assert text is not None
    cmd, a, b = spans[-1]
    out = [text[a:b].strip()]
    later_cmd = cmd
    for cmd, a, b in reversed(spans[:-1]):
        if b >= later_cmd:          # encloses the box after it: math-verify stops here
            break
        content = text[a:b].strip()
        gap = text[b + 1:later_cmd]
        adjacent = len(gap) < _NEAR or (content != out[-1] and len(gap) < _FAR
                                        and _SEPARATOR_WORDS.search(gap) is not None)
        if not adjacent:
            break
        if content != out[-1]:
            out.append(content)
        later_cmd = cmd
    return out[::-1]


def gold_boxes(text: str | None) -> list[str]:
    """Every innermost box of a reference solution, in order, each distinct content once."""
    spans = boxed_spans(text)
    out: list[str] = []
    for i, (cmd, a, b) in enumerate(spans):
        if any(a <= c2 and b2 <= b for c2, _, b2 in spans[i + 1:]):
            continue                  # encloses another box: keep the inner one
        content = text[a:b].strip()  # type: ignore[index]
        if content not in out:
            out.append(content)
    return out


def answer_text(parts: list[str]) -> str | None:
    """Several boxed contents as one answer, joined the way math-verify joins them (``,``)."""
    return ",".join(parts) if parts else None


# ----------------------------------------------------------------------------- separators
_SPACE = r"(?:\s*(?:\\[,:;> ]|\\thinspace\b|~|\{\\,\})\s*|[ \u00a0\u2009\u202f\u2007])"
_GROUPED_INT = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_SPACE}\d{{3}})+(?!\d)")
_GROUPED_FRAC = re.compile(rf"(?<=\.)\d{{3}}(?:{_SPACE}\d{{1,3}})+(?!\d)")
_BRACE_COMMA = r"\{,\}"
_BRACE_THOUSANDS = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_BRACE_COMMA}\d{{3}})+(?![\d]|{_BRACE_COMMA}\d)")
_BRACE_DECIMAL = re.compile(rf"(?<=\d){_BRACE_COMMA}(?=\d)")
_NON_DIGIT = re.compile(r"\D+")


def _digits_only(m: re.Match) -> str:
    return _NON_DIGIT.sub("", m.group())


def normalize_separators(latex: str) -> str:
    """Remove digit-group separators and read ``{,}`` decimal commas (see the module rules)."""
    if not any(ch.isdigit() for ch in latex):
        return latex
    s = _GROUPED_INT.sub(_digits_only, latex)
    s = _GROUPED_FRAC.sub(_digits_only, s)
    s = _BRACE_THOUSANDS.sub(_digits_only, s)
    return _BRACE_DECIMAL.sub(".", s)


def prepare_completion(text: str | None) -> str | None:
    """The completion as math-verify reads it, or ``None`` when it has no complete box.

    ``\\fbox`` becomes ``\\boxed`` (math-verify's boxed patterns match only the latter), digit
    separators are normalised inside every box, and a trailing unclosed ``\\boxed{`` (after
    the last complete box: a truncated completion) is cut off; the rest of the text is unchanged,
    so math-verify's own box and math-environment matching decides which boxes form the answer.
    """
    if not text:
        return None
    text = _FBOX.sub(r"\\boxed", text)   # math-verify's patterns look for \boxed only
    spans = boxed_spans(text)
    if not spans:
        return None
    last_open = max(m.start() for m in _BOXED_RE.finditer(text))
    if last_open > spans[-1][0]:
        text = text[:last_open]
    out, pos = [], 0
    for cmd, a, b in spans:
        if a < pos:               # nested inside a box already rewritten
            continue
        out += [text[pos:a], normalize_separators(text[a:b])]
        pos = b
    return "".join(out) + text[pos:]


def gsm8k_gold(answer: str) -> str:
    """The number after GSM8K's ``####`` marker, without thousands separators."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer without '####': {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "").rstrip(".")
