"""Answer grading shared by the RL reward and by evaluation.

* :func:`score_math` / :func:`score_math_batch` grade a completion's final boxed answer against a
  gold answer with math-verify (gold parsed first, prediction second: ``verify`` is not symmetric).
  *What* is graded (several boxes, golds with several boxes, digit separators) is decided in
  :mod:`lorarl.grading.answers`; *how* values compare is math-verify's ``verify`` under
  :class:`GradingSettings` (float rounding, numeric precision, strict mode, set/relation comparison;
  the defaults are math-verify's).  ``GradingSettings.answer_format`` other than ``boxed`` grades by
  a text rule instead (DAPO's last ``Answer:`` line, GSM8K's last number:
  :mod:`lorarl.grading.answer_formats`), in this process (pure string code on bounded text).
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
comparison at ``timeout_s`` (the worker lives on), and the parent kills and replaces a worker that
has not answered ``_GRACE_S`` after that (e.g. stuck in C code that never checks for signals).
The pool size defaults to ``min(8, cpu_count)`` and can be set with ``LORARL_GRADER_WORKERS``.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Mapping, Sequence

from lorarl.grading.answers import (answer_text, extract_boxed, final_boxed, gold_boxes,
                            normalize_separators, prepare_completion)

__all__ = ["Score", "GradingSettings", "extract_boxed", "score_math", "score_math_batch", "shutdown_pool"]

_GRACE_S = 0.5          # parent-side margin on top of the in-worker timer
_STARTUP_S = 120.0      # how long to wait for a fresh worker to import math-verify


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


def _worker_main(conn: Connection) -> None:
    """Worker loop: announce readiness, then run ``(fn, args)`` requests until the pipe closes."""
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when workers stop
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401 - pay the import before announcing readiness

    conn.send(("ready", os.environ.get("PYTHONHASHSEED")))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - report, keep serving
            conn.send(("error", repr(exc)))


# ----------------------------------------------------------------------------- parent side
WORKER_HASH_SEED = "0"   # string hashing in the workers (set iteration order inside sympy)
_env_lock = threading.Lock()


class _Worker:
    """One persistent worker process and its pipe."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True,
                                name="lorarl-grader")
        with _env_lock:   # a spawned interpreter reads its hash seed from the environment
            old = os.environ.get("PYTHONHASHSEED")
            os.environ["PYTHONHASHSEED"] = WORKER_HASH_SEED
            try:
                self.proc.start()
            finally:
                if old is None:
                    os.environ.pop("PYTHONHASHSEED", None)
                else:
                    os.environ["PYTHONHASHSEED"] = old
        child.close()
        self.ready = False
        self.hash_seed: str | None = None   # PYTHONHASHSEED the worker reported at start
        self.started = time.monotonic()

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(timeout=5)
        finally:
            self.conn.close()


class _Pool:
    """Persistent worker processes with a per-task wall-clock limit, killed and replaced on expiry."""

    def __init__(self, n_workers: int) -> None:
        self._ctx = mp.get_context("spawn")
        self._n = max(1, n_workers)
        self._workers: list[_Worker] = [_Worker(self._ctx) for _ in range(self._n)]
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def _replace(self, k: int) -> None:
        self._workers[k].kill()
        self._workers[k] = _Worker(self._ctx)

    def run(self, fn: Callable[..., Any], arglist: Sequence[tuple], timeout_s: float
            ) -> list[tuple[str, Any]]:
        """Run ``fn(*args)`` for every args in parallel; each result is ``(status, value)`` with
        status ``ok``, ``error`` (exception or dead worker) or ``timeout`` (worker killed)."""
        with self._lock:
            results: list[tuple[str, Any]] = [("error", "not run")] * len(arglist)
            pending = collections.deque(range(len(arglist)))
            running: dict[int, tuple[int, float]] = {}   # worker -> (task, deadline)
            try:
                while pending or running:
                    for k, w in enumerate(self._workers):
                        if pending and w.ready and k not in running:
                            i = pending.popleft()
                            try:
                                w.conn.send((fn, arglist[i]))
                                running[k] = (i, time.monotonic() + timeout_s + _GRACE_S)
                            except (OSError, ValueError):
                                pending.appendleft(i)
                                self._replace(k)
                    now = time.monotonic()
                    deadlines = [d for _, d in running.values()]
                    deadlines += [w.started + _STARTUP_S for w in self._workers if not w.ready]
                    wait_s = max(0.0, min(deadlines) - now) if deadlines else 0.0
                    for conn in wait([w.conn for w in self._workers], timeout=wait_s):
                        k = next(j for j, w in enumerate(self._workers) if w.conn is conn)
                        try:
                            status, value = conn.recv()
                        except (EOFError, OSError):       # the worker died (crash, OOM, ...)
                            if k in running:
                                results[running.pop(k)[0]] = ("error", "worker died")
                            self._replace(k)
                            continue
                        if status == "ready":
                            self._workers[k].ready = True
                            self._workers[k].hash_seed = value
                        elif k in running:
                            results[running.pop(k)[0]] = (status, value)
                    now = time.monotonic()
                    for k, (i, deadline) in list(running.items()):
                        if now >= deadline:
                            results[i] = ("timeout", None)
                            del running[k]
                            self._replace(k)
                    for k, w in enumerate(self._workers):
                        if not w.ready and now >= w.started + _STARTUP_S:
                            raise RuntimeError("grading worker failed to start")
            except BaseException:
                # interrupted (e.g. KeyboardInterrupt): busy workers would answer late, into the
                # next call; replace them so no stale result can ever be read
                for k in running:
                    self._replace(k)
                raise
            return results

    def wait_ready(self, timeout_s: float = _STARTUP_S) -> bool:
        """Wait until every worker has announced itself (imported math-verify, reported its hash seed): a batch
        can end before a slow starter is ready, as ready workers take all its tasks. False on the deadline."""
        with self._lock:
            deadline = time.monotonic() + timeout_s
            while not all(w.ready for w in self._workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for conn in wait([w.conn for w in self._workers if not w.ready], timeout=left):
                    k = next(j for j, w in enumerate(self._workers) if w.conn is conn)
                    try:
                        status, value = conn.recv()
                    except (EOFError, OSError):   # died while starting: a fresh one in its place
                        self._replace(k)
                        continue
                    if status == "ready":
                        self._workers[k].ready, self._workers[k].hash_seed = True, value
            return True

    def close(self) -> None:
        for w in self._workers:
            w.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is not None and _pool.pid != os.getpid():
            _pool = None          # inherited through fork: those workers belong to the parent
        if _pool is None:
            n = int(os.environ.get("LORARL_GRADER_WORKERS", min(8, os.cpu_count() or 1)))
            _pool = _Pool(n)
        return _pool


def shutdown_pool() -> None:
    """Stop the grading workers (they are restarted on the next call)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


atexit.register(shutdown_pool)


# ----------------------------------------------------------------------------- public scoring
def score_math_batch(golds: Sequence[str], completions: Sequence[str], timeout_s: float = 5.0,
                     settings: GradingSettings | None = None) -> list[Score]:
    """Grade ``completions[i]`` against ``golds[i]`` in parallel; see :func:`score_math`."""
    if len(golds) != len(completions):
        raise ValueError(f"{len(golds)} golds but {len(completions)} completions")
    settings = settings or DEFAULT_SETTINGS
    if settings.answer_format != "boxed":   # DAPO's Answer: line, GSM8K's last number: exact text rules
        from lorarl.grading.answer_formats import verdict

        return [Score(*verdict(settings.answer_format, c, g)) for g, c in zip(golds, completions)]
    prepared = [prepare_completion(c) for c in completions]
    todo = [i for i, p in enumerate(prepared) if p is not None]
    scores = [Score(False, None, False)] * len(completions)
    if not todo:
        return scores
    outcomes = _get_pool().run(_math_task, [(str(golds[i]), prepared[i], timeout_s, settings)
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
