"""Answer grading shared by the RL reward and by evaluation.

* :func:`score_math` / :func:`score_math_batch` grade a completion's final boxed answer against a
  gold answer with math-verify (gold parsed first, prediction second: ``verify`` is not symmetric).
  *What* is graded (several boxes, golds with several boxes, digit separators) is decided in
  :mod:`lorarl.grading.answers`; *how* values compare is math-verify's ``verify`` under
  :class:`GradingSettings` (float rounding, numeric precision, strict mode, set/relation comparison;
  the defaults are math-verify's).  ``GradingSettings.answer_format`` other than ``boxed`` grades by
  a text rule instead (DAPO's last ``Answer:`` line, GSM8K's last number:
  :mod:`lorarl.grading.answer_formats`), in this process (pure string code on bounded text); ``xml_math``
  hands math-verify the ``<answer>`` span as one boxed answer.
* :func:`score_choice` grades multiple-choice answers by letter extraction (no math-verify).

Every comparison runs in a persistent worker process under a hard time limit, so a pathological
answer costs at most ``timeout_s`` (plus a small margin) and scores ``correct=False,
timed_out=True``; exceptions and worker crashes score ``correct=False`` and never propagate.
Model output is only ever parsed as text: nothing is evaluated as code.  Importing this module is
cheap (no torch / transformers / sympy); math-verify is imported inside the worker processes.

**Determinism.**  A verdict is a pure function of (gold, completion, settings): sympy's answer for
degenerate expressions (gold ``0`` against ``\\boxed{4 0/0}``) depends on three kinds of process
state, all pinned here.  (1) ``sympy.core.random._assumptions_rng``, an unseeded RNG that shuffles the
order in which assumption facts are inferred and advances with every query: re-seeded before each
comparison.  (2) Objects shared through sympy's ``cacheit`` cache (``Mul(4, 0, evaluate=False)`` is one
object) and math-verify's ``lru_cache``s, whose lazily computed assumptions (``is_zero``...) steer
``simplify`` later: all cleared before each comparison.  (3) String hashing (set iteration order of
assumption names and symbols): workers run with ``PYTHONHASHSEED=0``.

Timeouts are enforced twice: inside the worker a ``SIGALRM`` interval timer interrupts the
comparison at ``timeout_s`` (the worker lives on), and the parent (:mod:`lorarl.grading.pool`) kills and replaces
a worker that has not answered a small margin after that (e.g. stuck in C code that never checks for signals).
The pool size defaults to ``min(8, cpu_count)`` and can be set with ``LORARL_GRADER_WORKERS``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from lorarl.grading.answers import (answer_text, extract_boxed, final_boxed, gold_boxes,
                            normalize_separators, prepare_completion)
from lorarl.grading.pool import get_pool, shutdown_pool

__all__ = ["Score", "GradingSettings", "extract_boxed", "score_math", "score_math_batch", "shutdown_pool"]


@dataclass(frozen=True)
class Score:
    """Outcome of grading one completion."""

    correct: bool
    extracted: str | None
    timed_out: bool = False


@dataclass(frozen=True)
class GradingSettings:
    """How math-verify compares values (``verify``'s keyword arguments; defaults are its own)."""

    float_rounding: int = 6  # decimal places floats are rounded to before comparing
    numeric_precision: int = 15  # significant digits of the numeric (evalf) comparison
    strict: bool = True  # False: variables match by position (f(x) = f(y)) and sets compare with tuples
    allow_set_relation_comp: bool = False  # True: a gold set equals a relation (1 < x < 2 vs (1, 2))
    answer_format: str = "boxed"  # which text is the answer: boxed (math-verify) or a text rule (lorarl.grading.answer_formats)

    def __post_init__(self) -> None:
        from lorarl.grading.answer_formats import ANSWER_FORMATS

        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"grading.answer_format must be one of {', '.join(ANSWER_FORMATS)}, "
                             f"got {self.answer_format!r}")
        for name in ("float_rounding", "numeric_precision"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "float_rounding" else 1):
                raise ValueError(f"grading.{name} must be an integer >= "
                                 f"{0 if name == 'float_rounding' else 1}, got {v!r}")
        for name in ("strict", "allow_set_relation_comp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"grading.{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "GradingSettings":
        """Settings from a summary's ``grading`` dict (missing keys: defaults; unknown: error)."""
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown grading setting(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


DEFAULT_SETTINGS = GradingSettings()


# ----------------------------------------------------------------------------- worker side
class _Deadline(BaseException):
    """Raised by the in-worker alarm; a BaseException so ``except Exception`` cannot swallow it."""


def _fresh_state() -> None:
    """Forget everything earlier comparisons left in sympy and math-verify (see the module doc)."""
    from math_verify import parser
    from sympy.core.cache import clear_cache
    from sympy.core.random import seed

    clear_cache()
    for cached in (parser.parse_latex_cached, parser.parse_expr_cached, parser.extract_latex):
        cached.cache_clear()
    seed(0)   # sympy's assumption-order RNG (and its public one)


def _boxed_answer(text: str) -> tuple[list[Any], str | None]:
    """math-verify's prediction list for ``text`` from its boxed patterns only (``[parsed, first
    matched string]`` like ``math_verify.parse`` with ``fallback_mode="first_match"``, or ``[]``)
    and the graded box contents as written."""
    from math_verify.parser import LatexExtractionConfig, extract_latex, lazy_latex_regex

    cfg = LatexExtractionConfig()
    patterns = [p for p, prio in lazy_latex_regex(cfg) if prio == cfg.boxed_match_priority]
    matches = sorted(((m.end(), -m.start(), k, m) for k, p in enumerate(patterns)
                      for m in p.finditer(text)), key=lambda t: t[:3], reverse=True)
    first: str | None = None
    for *_, m in matches:
        parsed, as_text = extract_latex(m, cfg)
        first = as_text if first is None and as_text else first
        if parsed is not None:
            return [parsed] + ([first] if first else []), _raw_boxes(m)
    return ([first] if first else []), None


def _raw_boxes(m: Any) -> str | None:
    """The box contents a match graded, as written: all boxes of a math-environment match, the
    :func:`~lorarl.grading.answers.final_boxed` run of a plain one."""
    plain = any(k.endswith("latexBoxed") and v for k, v in m.groupdict().items())
    return answer_text(final_boxed(m.group(0)) if plain else gold_boxes(m.group(0)))


def _math_task(gold: str, pred: str, timeout_s: float,
               settings: GradingSettings = DEFAULT_SETTINGS) -> tuple[bool, bool, str | None]:
    """Runs in a worker: ``(correct, timed_out, graded text)`` of math-verify on gold vs completion.

    ``gold`` is a plain answer or a solution with boxes; ``pred`` the completion prepared by
    :func:`lorarl.grading.answers.prepare_completion`.
    """
    import signal

    from math_verify import parse, verify

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Deadline()

    _fresh_state()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(timeout_s, 1e-3))
    graded: str | None = None
    try:
        g = parse(_gold_latex(gold), parsing_timeout=None)
        p, graded = _boxed_answer(pred)
        if not g or not p:
            return False, False, graded
        return bool(verify(g, p, float_rounding=settings.float_rounding,
                           numeric_precision=settings.numeric_precision, strict=settings.strict,
                           allow_set_relation_comp=settings.allow_set_relation_comp,
                           timeout_seconds=None)), False, graded
    except _Deadline:
        return False, True, graded
    except Exception:  # noqa: BLE001 - any grading failure is simply "not correct"
        return False, False, graded
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _gold_latex(gold: str) -> str:
    """The gold as one box: a plain answer (``42``, ``$x=3$``) wrapped whole; a solution with boxes
    gives all of them (:func:`lorarl.grading.answers.gold_boxes`); digit separators normalised."""
    g = gold.strip()
    boxes = gold_boxes(g) if ("\\boxed" in g or "\\fbox" in g) else []
    body = answer_text(boxes) if boxes else g.strip("$").strip()
    return "\\boxed{" + normalize_separators(body) + "}"


# ----------------------------------------------------------------------------- public scoring
def score_math_batch(golds: Sequence[str], completions: Sequence[str], timeout_s: float = 5.0,
                     settings: GradingSettings | None = None) -> list[Score]:
    """Grade ``completions[i]`` against ``golds[i]`` in parallel; see :func:`score_math`."""
    if len(golds) != len(completions):
        raise ValueError(f"{len(golds)} golds but {len(completions)} completions")
    settings = settings or DEFAULT_SETTINGS
    from lorarl.grading.answer_formats import SPANS, TEXT_RULES, span_as_boxed, verdict

    if settings.answer_format in TEXT_RULES:   # DAPO's Answer: line, GSM8K's last number, <answer> text: exact rules
        return [Score(*verdict(settings.answer_format, c, g)) for g, c in zip(golds, completions)]
    if settings.answer_format in SPANS:   # xml_math: math-verify on the <answer> span, as one boxed answer
        completions = [span_as_boxed(settings.answer_format, c) or "" for c in completions]
    prepared = [prepare_completion(c) for c in completions]
    todo = [i for i, p in enumerate(prepared) if p is not None]
    scores = [Score(False, None, False)] * len(completions)
    if not todo:
        return scores
    outcomes = get_pool().run(_math_task, [(str(golds[i]), prepared[i], timeout_s, settings)
                                            for i in todo], timeout_s)
    for i, (status, value) in zip(todo, outcomes):
        # what was graded: the matched boxes as written (else the plain-box rule of the raw text)
        fallback = answer_text(final_boxed(completions[i]))
        if status == "ok":
            scores[i] = Score(bool(value[0]), value[2] or fallback, bool(value[1]))
        else:
            scores[i] = Score(False, fallback, status == "timeout")
    return scores


def score_math(gold: str, completion: str, timeout_s: float = 5.0,
               settings: GradingSettings | None = None) -> Score:
    """Grade one completion: its final boxed answer (:func:`lorarl.grading.answers.final_boxed`; several
    adjacent boxes are one answer, graded as a set) against ``gold`` with math-verify.

    ``extracted`` is the graded text (box contents joined with ``,``).  No boxed answer gives
    ``Score(False, None, False)`` (math-verify never sees the free text).  Returns within about
    ``timeout_s`` + 0.5 s once the worker pool is up (the first call also pays the worker
    start-up, about a second).
    """
    return score_math_batch([gold], [completion], timeout_s, settings)[0]


# Each piece is one character class with one quantifier: linear time on any input.
