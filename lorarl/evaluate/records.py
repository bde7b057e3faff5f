"""Per-sample evaluation records, summaries, and re-scoring.

For a benchmark (and optionally a checkpoint step) an evaluation writes, atomically:

* ``<dir>/<benchmark>[@<step>].jsonl``: one line per sample with problem id, sample index,
  prompt, gold, completion, extracted answer, correct, timed_out, truncated and token count (and, for a
  multiple-choice problem, its choices in the order the prompt showed them: the letter grader reads an
  answer span's option text against them, so a re-score needs them);
* ``<dir>/<benchmark>[@<step>].json``: the summary: protocol, grader, metrics (value and 95%
  interval over problems), number of problems/samples, truncation and token statistics, the
  math-verify version and grading settings, and the caller's ``meta`` (cell, model, seed, ...).

:func:`rescore` grades the stored completions again (no generation) and recomputes the summary
with the same code, so on an unchanged grader it reproduces the stored summary exactly.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from lorarl.evaluate.backends import Completion
from lorarl.grading.answer_formats import SPANS
from lorarl.grading.benchmarks import Benchmark, Problem, grade
from lorarl.grading.protocols import Protocol, summarize
from lorarl.grading.verify import GradingSettings
from lorarl.io import atomic_write_text
from lorarl.jobclock import first_work

__all__ = ["Sample", "samples_path", "summary_path", "grade_samples", "summarize_samples",
           "write_records", "read_samples", "rescore", "rescore_samples", "changed_verdicts",
           "write_rescored", "jsonl_text", "run_benchmark", "aggregate_seeds"]


@dataclass(frozen=True)
class Sample:
    """One graded completion."""

    problem_id: str
    sample: int  # index among the problem's n samples
    prompt: str
    gold: str
    completion: str
    extracted: str | None
    correct: bool
    timed_out: bool
    truncated: bool
    n_tokens: int
    choices: tuple[str, ...] | None = None  # a multiple-choice problem's options as the prompt listed them (rescore)

    def record(self) -> dict[str, Any]:
        """The jsonl row: every field, ``choices`` only where the problem has them (math records as before)."""
        row = asdict(self)
        if self.choices is None:
            del row["choices"]
        return row

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> "Sample":
        """A stored row (one written before choices were kept has none: letters only, see :func:`rescore_samples`)."""
        choices = row.get("choices")
        return cls(**{**row, "choices": tuple(choices) if choices is not None else None})


def _stem(benchmark: str, step: int | None) -> str:
    return benchmark if step is None else f"{benchmark}@{step}"


def samples_path(out_dir: str | Path, benchmark: str, step: int | None = None) -> Path:
    """``<dir>/<benchmark>[@step].jsonl``."""
    return Path(out_dir) / f"{_stem(benchmark, step)}.jsonl"


def summary_path(out_dir: str | Path, benchmark: str, step: int | None = None) -> Path:
    """``<dir>/<benchmark>[@step].json``."""
    return Path(out_dir) / f"{_stem(benchmark, step)}.json"


def _summary_of(jsonl: Path) -> Path:
    return jsonl.with_suffix(".json")


def grade_samples(benchmark: Benchmark, problems: Sequence[Problem],
                  completions: Sequence[Sequence[Completion]], timeout_s: float = 5.0,
                  grading: GradingSettings | None = None) -> list[Sample]:
    """Grade every completion (``completions[i]`` are the samples of ``problems[i]``)."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completion lists")
    flat = [(p, j, c) for p, cs in zip(problems, completions) for j, c in enumerate(cs)]
    scores = benchmark.grade([p for p, _, _ in flat], [c.text for _, _, c in flat], timeout_s,
                             grading)
    return [Sample(p.id, j, p.prompt, p.gold, c.text, s.extracted, s.correct, s.timed_out,
                   c.truncated, c.n_tokens, p.choices) for (p, j, c), s in zip(flat, scores)]


def _matrix(samples: Iterable[Sample]) -> list[list[bool]]:
    rows: dict[str, dict[int, bool]] = {}
    for s in samples:
        rows.setdefault(s.problem_id, {})[s.sample] = s.correct
    return [[r[j] for j in sorted(r)] for r in rows.values()]


def _math_verify_version() -> str | None:
    try:
        return metadata.version("math-verify")
    except metadata.PackageNotFoundError:
        return None


def summarize_samples(samples: Sequence[Sample], protocol: Protocol, *, benchmark: str,
                      grader: str, letters: str = "ABCD", step: int | None = None,
                      timeout_s: float = 5.0, meta: Mapping[str, Any] | None = None,
                      grading: GradingSettings | None = None) -> dict[str, Any]:
    """The summary dict of graded samples (JSON-serialisable, deterministic in its inputs);
    ``grading`` (math grader only) is recorded as the settings the samples were graded under."""
    if not samples:
        raise ValueError("no samples")
    metrics = summarize(_matrix(samples), protocol)
    tokens = [s.n_tokens for s in samples]
    return {
        "benchmark": benchmark,
        "step": step,
        "grader": grader,
        "letters": letters,
        "timeout_s": timeout_s,
        "protocol": protocol.model_dump(mode="json"),
        "primary_metric": protocol.primary_metric,
        "metrics": {k: m.to_dict() for k, m in metrics.items()},
        "n_problems": len({s.problem_id for s in samples}),
        "n_samples": len(samples),
        "truncated_frac": sum(s.truncated for s in samples) / len(samples),
        "timed_out": sum(s.timed_out for s in samples),
        "mean_tokens": math.fsum(tokens) / len(tokens),
        "max_tokens": max(tokens),
        "math_verify": _math_verify_version(),
        "grading": (grading or GradingSettings()).to_dict() if grader == "math" or (
            grading is not None and grading != GradingSettings()) else None,  # a letter grader's span format too
        "meta": dict(meta or {}),
    }


def _jsonl(samples: Iterable[Sample]) -> str:
    return jsonl_text(s.record() for s in samples)


def jsonl_text(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows)


def write_records(out_dir: str | Path, benchmark: str, samples: Sequence[Sample],
                  protocol: Protocol, *, grader: str, letters: str = "ABCD",
                  step: int | None = None, timeout_s: float = 5.0,
                  meta: Mapping[str, Any] | None = None,
                  grading: GradingSettings | None = None) -> dict[str, Any]:
    """Write the samples jsonl and the summary json (both atomically); return the summary."""
    summary = summarize_samples(samples, protocol, benchmark=benchmark, grader=grader,
                                letters=letters, step=step, timeout_s=timeout_s, meta=meta,
                                grading=grading)
    atomic_write_text(samples_path(out_dir, benchmark, step), _jsonl(samples))
    atomic_write_text(summary_path(out_dir, benchmark, step), json.dumps(summary, indent=2) + "\n")
    return summary


def read_samples(jsonl_path: str | Path) -> list[Sample]:
    """The samples stored in a jsonl file."""
    with open(jsonl_path, encoding="utf-8") as f:
        return [Sample.from_record(json.loads(line)) for line in f if line.strip()]


def rescore_samples(jsonl_path: str | Path, *, timeout_s: float | None = None,
                    grading: GradingSettings | None = None
                    ) -> tuple[list[Sample], list[Sample], dict[str, Any]]:
    """Grade the stored completions again: ``(stored samples, re-graded samples, new summary)``.

    Protocol, grader and meta come from the summary json next to the jsonl; the grading settings
    too unless ``grading`` is given (summaries without them were graded under the defaults).  Multiple-choice
    samples stored without their choices (records older than the option-text rule) are graded on letters
    only, as they were, and a line on stderr says so.
    """
    jsonl_path = Path(jsonl_path)
    old = json.loads(_summary_of(jsonl_path).read_text(encoding="utf-8"))
    samples = read_samples(jsonl_path)
    timeout = old.get("timeout_s", 5.0) if timeout_s is None else timeout_s
    letters = old.get("letters", "ABCD")
    settings = grading or GradingSettings.from_dict(old.get("grading"))
    bare = sum(s.choices is None for s in samples)
    if old["grader"] == "choice" and settings.answer_format in SPANS and bare:
        print(f"[lorarl] rescore {jsonl_path}: {bare} sample(s) stored without their problem's choices (records "
              f"older than the option-text rule): the {settings.answer_format} span is read for letters only",
              file=sys.stderr, flush=True)
    scores = grade(old["grader"], [s.gold for s in samples], [s.completion for s in samples],
                   timeout, letters, settings, [s.choices for s in samples])
    new = [Sample(**{**asdict(s), "extracted": sc.extracted, "correct": sc.correct,
                     "timed_out": sc.timed_out}) for s, sc in zip(samples, scores)]
    summary = summarize_samples(new, Protocol.model_validate(old["protocol"]),
                                benchmark=old["benchmark"], grader=old["grader"], letters=letters,
                                step=old.get("step"), timeout_s=timeout, meta=old.get("meta"),
                                grading=settings)
    return samples, new, summary


def changed_verdicts(old: Sequence[Sample], new: Sequence[Sample]) -> list[dict[str, Any]]:
    """The samples whose verdict changed: id, sample index, gold, extracted and correct before/after."""
    return [{"problem_id": a.problem_id, "sample": a.sample, "gold": a.gold,
             "extracted_before": a.extracted, "extracted_after": b.extracted,
             "correct_before": a.correct, "correct_after": b.correct}
            for a, b in zip(old, new) if a.correct != b.correct]


def rescore(jsonl_path: str | Path, *, timeout_s: float | None = None, write: bool = False,
            grading: GradingSettings | None = None) -> dict[str, Any]:
    """Grade the stored completions again and return the recomputed summary.

    With ``write=True`` the jsonl (extracted/correct/timed_out) and the summary are replaced
    atomically (left untouched when nothing changed, so downstream Snakemake jobs do not rerun).
    """
    jsonl_path = Path(jsonl_path)
    samples, new, summary = rescore_samples(jsonl_path, timeout_s=timeout_s, grading=grading)
    if write:
        old = json.loads(_summary_of(jsonl_path).read_text(encoding="utf-8"))
        write_rescored(jsonl_path, samples, new, summary, old)
    return summary


def write_rescored(jsonl_path: Path, samples: Sequence[Sample], new: Sequence[Sample],
                   summary: dict[str, Any], old_summary: dict[str, Any]) -> bool:
    """Replace jsonl and summary after a re-score, only if anything changed (keeps mtimes)."""
    if list(new) == list(samples) and json.loads(json.dumps(summary)) == old_summary:
        return False
    atomic_write_text(jsonl_path, _jsonl(new))
    atomic_write_text(_summary_of(jsonl_path), json.dumps(summary, indent=2) + "\n")
    return True


def run_benchmark(backend: Any, benchmark: Benchmark, problems: Sequence[Problem],
                  out_dir: str | Path, *, protocol: Protocol | None = None, seed: int = 0,
                  step: int | None = None, timeout_s: float = 5.0,
                  meta: Mapping[str, Any] | None = None,
                  grading: GradingSettings | None = None) -> dict[str, Any]:
    """Generate, grade and write the records of one benchmark; return the summary (``grading``:
    default the benchmark's registry settings)."""
    protocol = protocol or benchmark.protocol
    grading = grading or benchmark.grading
    first_work("evaluation batch")  # the job's start-up ends here (lorarl.jobclock)
    t0 = time.perf_counter()
    completions = backend.generate([p.prompt for p in problems], protocol, seed)
    generation_s = time.perf_counter() - t0
    from lorarl import ledger

    ledger.spent("generation", generation_s)
    with ledger.phase("reward"):  # grading (lorarl.ledger)
        samples = grade_samples(benchmark, problems, completions, timeout_s, grading)
    n_choices = max((len(p.choices or ()) for p in problems), default=0)
    letters = "ABCDEFGHIJ"[: n_choices] if n_choices else "ABCD"
    return write_records(out_dir, benchmark.name, samples, protocol, grader=benchmark.grader,
                         letters=letters, step=step, timeout_s=timeout_s, grading=grading,
                         meta={"seed": seed, **dict(meta or {}),
                               "generation_s": round(generation_s, 3),
                               "grading_s": round(time.perf_counter() - t0 - generation_s, 3)})


def aggregate_seeds(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean and sample standard deviation of each metric over seeds (the aggregated tables)."""
    out: dict[str, dict[str, float]] = {}
    names = summaries[0]["metrics"] if summaries else {}
    for name in names:
        vals = [float(s["metrics"][name]["value"]) for s in summaries]
        mean = math.fsum(vals) / len(vals)
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        out[name] = {"mean": mean, "sd": sd, "n_seeds": len(vals)}
    return out
