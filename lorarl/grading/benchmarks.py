"""Benchmark registry: where each benchmark's data lives, how a row becomes a :class:`Problem`,
how answers are graded, and the default protocol of the studies.

Every benchmark loads through :meth:`Benchmark.load`: either from the hub (``datasets.load_dataset``
with id, config, revision and split) or from a local ``.jsonl``/``.json``/``.parquet`` file in the
same schema (optionally renaming columns with ``field_map``), or from in-memory rows.  Both paths
give the same ``datasets`` rows and go through the same row converter, so tests on local files in
the real schema exercise the code that runs on the hub data.

Default protocols follow the studies: GSM8K and GPQA greedy pass@1 (4096 new tokens, the KL-free
study's table); MATH-500 and Minerva avg@4, AIME/AMC/HMMT avg@32, all at T 0.6 / top-p 0.95 with
32768 new tokens and pass@k at k = n (the PEFT study's Avg/Pass table).  Every hub benchmark is pinned to
a dataset commit (``revision``, where each was found: docs/evaluation.md) and states its problem count at
that commit (``n_problems``: the sample-weighted Avg's weights; a full load of the pinned data that counts
otherwise is an error); a study's ``eval.benchmarks.<b>.revision`` pins another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from lorarl.grading.answers import gsm8k_gold
from lorarl.grading.protocols import Protocol
from lorarl.grading.choice import score_choice
from lorarl.grading.verify import GradingSettings, Score, extract_boxed, score_math_batch

__all__ = ["Problem", "Benchmark", "BENCHMARKS", "register", "get_benchmark", "load_rows",
           "grade", "gsm8k_gold", "MATH_TEMPLATE", "CHOICE_TEMPLATE", "CHOICE_THINK_TEMPLATE",
           "CHOICE_SPAN_TEMPLATE"]

MATH_TEMPLATE = ("{question}\n\nPlease reason step by step, and put your final answer within "
                 "\\boxed{{}}.")
CHOICE_TEMPLATE = ("Answer the following multiple choice question.\n\n{question}\n\n{choices}\n\n"
                   "Please reason step by step, and put the letter of your final answer "
                   "({letters}) within \\boxed{{}}.")
CHOICE_THINK_TEMPLATE = ("Answer the following multiple choice question.\n\n{question}\n\n{choices}\n\n"
                         "First think through the problem inside <think> </think> tags, then put the letter of "
                         "your final answer ({letters}) within \\boxed{{}}.")  # prompt.think: one instruction, the letter's
CHOICE_SPAN_TEMPLATE = ("Answer the following multiple choice question.\n\n{question}\n\n{choices}\n\n"
                        "Please reason step by step, and give the letter of your final answer ({letters}).")  # a span format's (xml_answer): where the answer goes is the system prompt's one instruction
LETTERS = "ABCDEFGHIJ"

Grader = Literal["math", "choice"]


@dataclass(frozen=True)
class Problem:
    """One evaluation problem: ``prompt`` is the rendered prompt, ``gold`` the reference answer
    (a math expression, or the correct letter for multiple choice with ``choices`` in letter order)."""

    id: str
    prompt: str
    gold: str
    choices: tuple[str, ...] | None = None


RowFn = Callable[[Mapping[str, Any], int], Problem]


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark: data source, row converter, prompt template, grader, protocol."""

    name: str
    row_fn: RowFn  # converts one dataset row (+ its index) into an unrendered Problem
    hub_id: str | None  # dataset id on the hub (None: local files / in-memory rows only)
    split: str  # split evaluated
    config: str | None = None  # dataset config (subset) name
    revision: str | None = None  # hub revision to pin (None = main)
    template: str = MATH_TEMPLATE  # prompt template, {question} (and {choices}, {letters})
    grader: Grader = "math"  # math-verify on \boxed answers, or letter extraction
    protocol: Protocol = field(default_factory=Protocol.greedy)  # default decoding and metrics
    grading: GradingSettings = GradingSettings()  # math-verify comparison settings (math grader)
    example: Mapping[str, Any] = field(default_factory=dict)  # one row in the real schema
    example_gold: str = ""  # the gold the converter must produce from ``example``
    row_filter: Callable[[Mapping[str, Any]], bool] | None = None  # keep only matching rows (a year of a pool)
    n_problems: int | None = None  # problems at the pinned revision (after row_filter): Avg weights, a load check
    before_training: bool = False  # measured on untrained rows only (base, teacher): a pre-training envelope
    harness: str | None = None  # an evaluation harness this entry reproduces: its template and grading.answer_format replace the cell's prompt.template and reward.answer_format

    def render(self, p: Problem, template: str | None = None) -> str:
        """The prompt of ``p`` (whose ``prompt`` holds the bare question) under the template."""
        choices = "\n".join(f"{LETTERS[i]}) {c}" for i, c in enumerate(p.choices or ()))
        letters = ", ".join(LETTERS[: len(p.choices or ())])
        return (template or self.template).format(question=p.prompt, choices=choices,
                                                  letters=letters)

    def problems(self, rows: Iterable[Mapping[str, Any]], template: str | None = None,
                 limit: int | None = None) -> list[Problem]:
        """Convert rows into rendered problems (ids must be unique)."""
        out: list[Problem] = []
        if self.row_filter is not None:
            rows = [r for r in rows if self.row_filter(r)]
        for i, row in enumerate(rows):
            if limit is not None and i >= limit:
                break
            try:
                p = self.row_fn(row, i)
            except KeyError as e:
                raise ValueError(f"{self.name}: row {i} lacks column {e} (has {sorted(row)}); "
                                 "pass field_map to rename columns") from None
            out.append(dataclasses.replace(p, prompt=self.render(p, template)))
        ids = [p.id for p in out]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.name}: duplicate problem ids")
        return out

    def load(self, path: str | Path | None = None, *, rows: Sequence[Mapping[str, Any]] | None = None,
             field_map: Mapping[str, str] | None = None, split: str | None = None,
             revision: str | None = None, template: str | None = None,
             limit: int | None = None) -> list[Problem]:
        """Load the problems: from ``rows``, a local file ``path``, or the hub (the default).

        ``field_map`` maps this benchmark's column names to the file's (``{"problem": "Problem"}``).
        """
        if rows is not None:
            data: Iterable[Mapping[str, Any]] = rows
        else:
            data = load_rows(path, hub_id=self.hub_id, config=self.config, split=split or self.split,
                             revision=revision or self.revision)
        if field_map:
            inverse = {src: dst for dst, src in field_map.items()}
            data = ({inverse.get(k, k): v for k, v in r.items()} for r in data)
        out = self.problems(data, template=template, limit=limit)
        pinned = rows is None and path is None and limit is None and (split or self.split) == self.split
        if pinned and self.n_problems and (revision or self.revision) == self.revision and len(out) != self.n_problems:
            raise ValueError(f"{self.name}: {self.hub_id}@{self.revision} gave {len(out)} problems, the registry "
                             f"states {self.n_problems}: the pinned data is not what the registry describes")
        return out

    def grade(self, problems: Sequence[Problem], completions: Sequence[str],
              timeout_s: float = 5.0, settings: GradingSettings | None = None) -> list[Score]:
        """Grade ``completions[i]`` against ``problems[i]`` (``settings``: default the registry's)."""
        letters = LETTERS[: max((len(p.choices or ()) for p in problems), default=4)]
        return grade(self.grader, [p.gold for p in problems], completions, timeout_s, letters,
                     settings or self.grading, [p.choices for p in problems])


def grade(grader: Grader, golds: Sequence[str], completions: Sequence[str], timeout_s: float = 5.0,
          letters: str = "ABCD", settings: GradingSettings | None = None,
          choices: Sequence[Sequence[str] | None] | None = None) -> list[Score]:
    """Grade completions against golds with the named grader (used again by ``rescore``); ``choices[i]``: the
    options of completion i's problem as its prompt showed them (the letter grader matches an answer span's
    option text to them; None: letters only)."""
    if grader == "math":
        return score_math_batch(list(golds), list(completions), timeout_s, settings)
    if grader == "choice":
        fmt = settings.answer_format if settings is not None else "boxed"  # a span format: the letter inside it
        opts = list(choices) if choices is not None else [None] * len(golds)
        return [score_choice(g, c, letters, fmt, o) for g, c, o in zip(golds, completions, opts, strict=True)]
    raise ValueError(f"unknown grader {grader!r}")


def load_rows(path: str | Path | None, *, hub_id: str | None = None, config: str | None = None,
              split: str = "test", revision: str | None = None) -> list[dict[str, Any]]:
    """Rows of a local ``.jsonl``/``.json``/``.parquet`` file, or of a hub dataset."""
    import datasets

    if path is not None:
        p = Path(path)
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(p.suffix)
        if kind is None:
            raise ValueError(f"unsupported local file {p} (use .jsonl, .json or .parquet)")
        if not p.exists():
            raise FileNotFoundError(p)
        ds = datasets.load_dataset(kind, data_files=str(p), split="train")
    elif hub_id is not None:
        ds = datasets.load_dataset(hub_id, config, split=split, revision=revision)
    else:
        raise ValueError("this benchmark has no hub id: pass a local path or rows")
    return [dict(r) for r in ds]


BENCHMARKS: dict[str, Benchmark] = {}


def register(name: str, **spec: Any) -> Callable[[RowFn], RowFn]:
    """Decorator registering a row converter as benchmark ``name`` (``spec``: Benchmark fields)."""

    def wrap(fn: RowFn) -> RowFn:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} registered twice")
        BENCHMARKS[name] = Benchmark(name=name, row_fn=fn, **spec)
        return fn

    return wrap


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark ``name``."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}") from None


# ----------------------------------------------------------------------------- helpers
def _num(v: Any) -> str:
    """A gold value as text; integral floats (``27.0`` from a float column) lose the ``.0``."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def _row_id(row: Mapping[str, Any], key: str, prefix: str, i: int) -> str:
    v = row.get(key)
    return f"{prefix}{v}" if v not in (None, "") else f"{prefix}{i}"


SAMPLE = Protocol.sampling  # T 0.6, top-p 0.95, 32768 new tokens, pass@k at k = n


# ----------------------------------------------------------------------------- registry
@register("gsm8k", hub_id="openai/gsm8k", config="main", split="test",
          revision="e53f048856ff4f594e959d75785d2c2d37b678ee", n_problems=1319,
          protocol=Protocol.greedy(4096),
          example={"question": "Tom has 3 apples and buys 39 more. How many?",
                   "answer": "He has 3+39=<<3+39=42>>42 apples.\n#### 42"}, example_gold="42")
def _gsm8k(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(f"test-{i}", str(row["question"]), gsm8k_gold(str(row["answer"])))


@register("math500", hub_id="HuggingFaceH4/MATH-500", split="test", protocol=SAMPLE(4),
          revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be", n_problems=500,
          example={"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "solution": "\\boxed{\\frac34}",
                   "answer": "\\frac{3}{4}", "subject": "Algebra", "level": 1,
                   "unique_id": "test/algebra/1.json"}, example_gold="\\frac{3}{4}")
def _math500(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(_row_id(row, "unique_id", "", i), str(row["problem"]), str(row["answer"]))


@register("aime24", hub_id="math-ai/aime24", split="test", protocol=SAMPLE(32),
          revision="83a7f387baaa524a8bda0022eac0541582297103", n_problems=30,
          example={"id": 60, "problem": "Find the remainder of $2024$ divided by $1000$.",
                   "solution": "The remainder is $\\boxed{24}$.", "url": "https://aops/2024-I-1"},
          example_gold="24")
def _aime24(row: Mapping[str, Any], i: int) -> Problem:
    # math-ai/aime24 has no answer column: the gold is the last boxed value of the solution (an
    # AIME answer is one integer, so earlier boxes are intermediate results; other golds with
    # several boxes keep all of them, see lorarl.grading.answers.gold_boxes)
    sol = str(row["solution"])
    return Problem(_row_id(row, "id", "", i), str(row["problem"]), extract_boxed(sol) or sol.strip())


@register("aime25", hub_id="math-ai/aime25", split="test", protocol=SAMPLE(32),
          revision="563bb8404243c5f09de6ec262f2db674fe5bce9b", n_problems=30,
          example={"problem": "Find $7 \\cdot 10 + 0$.", "answer": "70", "id": "0"},
          example_gold="70")
def _aime25(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(_row_id(row, "id", "", i), str(row["problem"]), _num(row["answer"]))


@register("aime22_24", hub_id="AI-MO/aimo-validation-aime", split="train", protocol=SAMPLE(32),
          revision="13f9e12f613e720c2a2b2f345dd04b998a29494d", n_problems=90,
          example={"id": 0, "problem": "Find $5^3$.", "solution": "$\\boxed{125}$",
                   "answer": "125", "url": "https://aops/2022-I-1"}, example_gold="125")
def _aime22_24(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(_row_id(row, "id", "", i), str(row["problem"]), _num(row["answer"]))


def _aime_year(year: int) -> Callable[[Mapping[str, Any]], bool]:
    """Rows of AI-MO/aimo-validation-aime from one contest year (its `url` names the year)."""
    pattern = re.compile(rf"(?<!\d){year}(?!\d)")

    def keep(row: Mapping[str, Any]) -> bool:
        return bool(pattern.search(str(row.get("url", ""))))

    keep.__name__ = f"aime_{year}"
    return keep


# Paper 003 reports AIME 2022, 2023 and 2024 as separate columns: the 2022 and 2023 thirds of the
# same pool (2024 is `aime24`, math-ai's copy, or the 2024 third of the pool).
for _year in (2022, 2023):
    register(f"aime{_year % 100}", hub_id="AI-MO/aimo-validation-aime", split="train", protocol=SAMPLE(32),
             revision="13f9e12f613e720c2a2b2f345dd04b998a29494d", n_problems=30,
             row_filter=_aime_year(_year),
             example={"id": 0, "problem": "Find $5^3$.", "solution": "$\\boxed{125}$", "answer": "125",
                      "url": f"https://artofproblemsolving.com/wiki/index.php/{_year}_AIME_I_Problems/Problem_1"},
             example_gold="125")(_aime22_24)
del _year


# Paper 001's Table 2: the pre-training capability envelope, sampled pass@1/4/8 on the full
# MATH-500 at 4096 tokens (sampling as in its training rollouts: T 0.7, top-p 0.95).
register("math500_envelope", hub_id="HuggingFaceH4/MATH-500", split="test",
         revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be", n_problems=500, before_training=True,
         protocol=SAMPLE(8, temperature=0.7, top_p=0.95, max_new_tokens=4096, ks=(1, 4, 8)),
         example=BENCHMARKS["math500"].example, example_gold="\\frac{3}{4}")(_math500)


@register("amc23", hub_id="math-ai/amc23", split="test", protocol=SAMPLE(32),
          revision="80815d37005feb82cd7f8fbc6901d5d3eff43057", n_problems=40,
          example={"id": 0, "question": "What is $3 \\cdot 9$?", "answer": 27.0,
                   "url": "https://aops/2023-AMC12A-1"}, example_gold="27")
def _amc23(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(_row_id(row, "id", "", i), str(row["question"]), _num(row["answer"]))


@register("minerva", hub_id="math-ai/minervamath", split="test", protocol=SAMPLE(4),
          revision="ee46ddc498933b1977577953250ca5c66be64f96", n_problems=272,
          example={"question": "A star has a parallax of 0.1 arcsec. Its distance in pc?",
                   "answer": "10"}, example_gold="10")
def _minerva(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(_row_id(row, "id", "", i), str(row["question"]), _num(row["answer"]))


@register("hmmt", hub_id="MathArena/hmmt_feb_2025", split="train", protocol=SAMPLE(32),
          revision="6fdc4277120810ff75aa22d2d5489b91f7a262a1", n_problems=30,
          example={"problem_idx": 1, "problem": "Compute $\\sqrt{16}$.", "answer": "4",
                   "problem_type": ["Algebra"]}, example_gold="4")
def _hmmt(row: Mapping[str, Any], i: int) -> Problem:
    return Problem(_row_id(row, "problem_idx", "", i), str(row["problem"]), _num(row["answer"]))


def shuffled_choices(key: str, correct: str, incorrect: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """Options in a deterministic per-problem order (seeded by ``key``) and the correct letter."""
    options = [correct.strip()] + [s.strip() for s in incorrect]
    order = list(range(len(options)))
    random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16)).shuffle(order)
    return tuple(options[j] for j in order), LETTERS[order.index(0)]


@register("gpqa", hub_id="Idavidrein/gpqa", config="gpqa_diamond", split="train",
          revision="633f5ee89ab8ad4522a9f850766b73f62147ffdd", n_problems=198,
          template=CHOICE_TEMPLATE, grader="choice", protocol=Protocol.greedy(4096),
          example={"Record ID": "rec06pnAkLOr2t2mp", "Question": "Which particle has spin 1/2?",
                   "Correct Answer": "electron", "Incorrect Answer 1": "photon",
                   "Incorrect Answer 2": "gluon", "Incorrect Answer 3": "Higgs boson",
                   "Subdomain": "Physics (general)"}, example_gold="D")
def _gpqa(row: Mapping[str, Any], i: int) -> Problem:
    rid = _row_id(row, "Record ID", "", i)
    choices, gold = shuffled_choices(rid + str(row["Question"]), str(row["Correct Answer"]),
                                     [str(row[f"Incorrect Answer {k}"]) for k in (1, 2, 3)])
    return Problem(rid, str(row["Question"]).strip(), gold, choices)


@register("synthetic", hub_id=None, split="eval", template="{question}",
          protocol=Protocol.greedy(48),
          example={"id": "eval-0", "prompt": "Q: 23+45-17=?\nA: ", "answer": "51"},
          example_gold="51")
def _synthetic(row: Mapping[str, Any], i: int) -> Problem:
    # rows are the {id, prompt, answer} records of lorarl.tasks.synthetic; prompts are complete
    return Problem(_row_id(row, "id", "", i), str(row["prompt"]), _num(row["answer"]))


# Evalchemy's AIME24 / AIME25 / AMC23 / MATH500 tasks (paper 004's evaluation; eval/chat_benchmarks/<task>/
# eval_instruct.py): their user message (the model's chat template applied, no system prompt), 32,768 new
# tokens, T 0.7 with vLLM's default top-p 1.0, 10 repetitions (MATH500: one), graded by hendrycks-MATH's
# is_equiv on the last \boxed{} (answer format hendrycks_boxed, lorarl.grading.hendrycks_math). The same hub
# copies as aime24 / aime25 / amc23 / math500, read at the same pinned commits.
EVALCHEMY_TEMPLATE = "Problem: {question}\nMark your solution with \\boxed\nAnswer:"


def _evalchemy(n: int) -> Protocol:
    return SAMPLE(n, temperature=0.7, top_p=1.0, max_new_tokens=32768)


def _aime24_evalchemy(row: Mapping[str, Any], i: int) -> Problem:
    # Evalchemy's file has `expected_answer` (73); math-ai/aime24 only the solution, whose box may read 073:
    # an integer box loses its leading zeros (is_equiv compares text)
    if "expected_answer" in row:
        return Problem(_row_id(row, "id", "", i), str(row["problem"]), str(row["expected_answer"]))
    p = _aime24(row, i)
    return dataclasses.replace(p, gold=str(int(p.gold)) if p.gold.isdigit() else p.gold)


_EVALCHEMY = dict(template=EVALCHEMY_TEMPLATE, harness="evalchemy", grading=GradingSettings(answer_format="hendrycks_boxed"))
register("aime24_evalchemy", hub_id="math-ai/aime24", split="test", revision=BENCHMARKS["aime24"].revision, n_problems=BENCHMARKS["aime24"].n_problems,
         protocol=_evalchemy(10), **_EVALCHEMY,
         example={"id": 60, "problem": "Find $w+z$.", "solution": "so $z=\\boxed{073}$", "url": "https://aops/2024-I-1"},
         example_gold="73")(_aime24_evalchemy)
register("aime25_evalchemy", hub_id="math-ai/aime25", split="test", revision=BENCHMARKS["aime25"].revision, n_problems=BENCHMARKS["aime25"].n_problems,
         protocol=_evalchemy(10), **_EVALCHEMY,
         example=BENCHMARKS["aime25"].example, example_gold="70")(_aime25)
register("amc23_evalchemy", hub_id="math-ai/amc23", split="test", revision=BENCHMARKS["amc23"].revision, n_problems=BENCHMARKS["amc23"].n_problems,
         protocol=_evalchemy(10), **_EVALCHEMY,
         example=BENCHMARKS["amc23"].example, example_gold="27")(_amc23)
register("math500_evalchemy", hub_id="HuggingFaceH4/MATH-500", split="test", revision=BENCHMARKS["math500"].revision, n_problems=BENCHMARKS["math500"].n_problems,
         protocol=_evalchemy(1), **_EVALCHEMY,
         example=BENCHMARKS["math500"].example, example_gold="\\frac{3}{4}")(_math500)
