"""Benchmark loaders: every registered benchmark loads local files in its real schema."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from lorarl.grading import benchmarks as bm
from lorarl.grading.benchmarks import (BENCHMARKS, LETTERS, Problem, get_benchmark, gsm8k_gold,
                                        shuffled_choices)
from lorarl.grading.protocols import Protocol

NAMES = sorted(BENCHMARKS)


def _rows(name: str, n: int = 3) -> list[dict]:
    """n rows in the benchmark's real schema: the registered example with distinct ids."""
    b = BENCHMARKS[name]
    rows = []
    for i in range(n):
        r = dict(b.example)
        for key in ("id", "unique_id", "problem_idx", "Record ID"):
            if key in r:
                r[key] = f"{r[key]}-{i}" if isinstance(r[key], str) else r[key] + i
        rows.append(r)
    return rows


def _write(tmp_path, name: str, rows: list[dict], suffix: str):
    path = tmp_path / f"{name}{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pd.DataFrame(rows).to_parquet(path)
    return path


def test_registry_has_the_issue_benchmarks():
    assert set(NAMES) >= {"gsm8k", "math500", "aime24", "aime25", "aime22_24", "amc23", "minerva",
                          "hmmt", "gpqa", "synthetic"}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_loads_local_files(tmp_path, name, suffix):
    b = BENCHMARKS[name]
    assert b.example, f"{name} must register an example row in its real schema"
    rows = _rows(name)
    problems = b.load(_write(tmp_path, name, rows, suffix))
    assert len(problems) == 3
    assert len({p.id for p in problems}) == 3
    reference = b.load(rows=[b.example])[0]
    assert reference.gold == b.example_gold
    for p in problems:
        assert isinstance(p, Problem)
        assert p.prompt.strip()
        if b.grader == "choice":      # option order is shuffled per problem id
            assert p.choices and p.gold in LETTERS[: len(p.choices)]
            correct = reference.choices[LETTERS.index(reference.gold)]
            assert p.choices[LETTERS.index(p.gold)] == correct
            assert "A) " in p.prompt and "\\boxed{}" in p.prompt
        else:
            assert p.gold == b.example_gold
            if name != "synthetic":  # a harness's own prompt (Evalchemy's) says "Mark your solution with \\boxed"
                assert ("\\boxed{}" if b.harness is None else "\\boxed\n") in p.prompt
    assert b.load(rows=rows) == problems            # in-memory rows: same converter
    assert b.load(_write(tmp_path, name, rows, suffix), limit=2) == problems[:2]


@pytest.mark.parametrize("name", NAMES)
def test_default_protocols_are_valid(name):
    p = BENCHMARKS[name].protocol
    assert isinstance(p, Protocol)
    assert Protocol.model_validate(p.model_dump()) == p


def test_study_protocols():
    assert BENCHMARKS["gsm8k"].protocol == Protocol.greedy(4096)
    m = BENCHMARKS["math500"].protocol
    assert (m.n, m.temperature, m.top_p, m.metric_names) == (4, 0.6, 0.95, ["avg@4", "pass@4"])
    for name in ("aime24", "aime25", "aime22_24", "amc23", "hmmt"):
        p = BENCHMARKS[name].protocol
        assert (p.n, p.temperature, p.top_p) == (32, 0.6, 0.95), name
    assert BENCHMARKS["minerva"].protocol.n == 4
    assert BENCHMARKS["gpqa"].protocol.kind == "greedy"


def test_hub_branch_passes_id_config_split_revision(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, revision=None, **kw):
        calls.append((path, name, split, revision))
        bench = next(b for b in BENCHMARKS.values() if b.hub_id == path)
        return datasets.Dataset.from_list(_rows(bench.name, 2))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    problems = get_benchmark("gsm8k").load(revision="abc123")
    assert calls == [("openai/gsm8k", "main", "test", "abc123")]
    assert [p.gold for p in problems] == ["42", "42"]
    with pytest.raises(ValueError, match=r"gpqa: Idavidrein/gpqa@633f5ee\w+ gave 2 problems, the registry states 198"):
        get_benchmark("gpqa").load(split="train")  # the pinned data, counted against the registry
    assert calls[-1] == ("Idavidrein/gpqa", "gpqa_diamond", "train", "633f5ee89ab8ad4522a9f850766b73f62147ffdd")
    assert len(get_benchmark("gpqa").load(limit=2)) == 2  # a limited load (smoke runs) is not counted


@pytest.mark.parametrize("answer, gold", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
    ("so 1,000 + 234\n#### 1,234", "1234"),
    ("#### -5", "-5"),
    ("a #### b\n#### 3.5", "3.5"),
])
def test_gsm8k_gold_extraction(answer, gold):
    assert gsm8k_gold(answer) == gold


def test_gsm8k_gold_without_marker_fails():
    with pytest.raises(ValueError):
        gsm8k_gold("no marker 42")


def test_aime24_gold_comes_from_boxed_solution():
    b = BENCHMARKS["aime24"]
    row = dict(b.example, solution="Long work ... so $\\boxed{\\frac{1}{2}}$ hmm \\boxed{204}.")
    assert b.load(rows=[row])[0].gold == "204"


def test_amc_float_answers_are_integral_text():
    b = BENCHMARKS["amc23"]
    assert b.load(rows=[dict(b.example, answer=27.0)])[0].gold == "27"
    assert b.load(rows=[dict(b.example, answer=2.5)])[0].gold == "2.5"


def test_gpqa_shuffle_is_deterministic_and_balanced():
    b = BENCHMARKS["gpqa"]
    rows = [dict(b.example, **{"Record ID": f"rec{i}", "Question": f"Q{i}?",
                               "Correct Answer": f"right{i}"}) for i in range(200)]
    first, again = b.load(rows=rows), b.load(rows=list(reversed(rows)))
    assert {p.id: (p.gold, p.choices) for p in first} == {p.id: (p.gold, p.choices) for p in again}
    for p, r in zip(first, rows):
        assert p.choices[LETTERS.index(p.gold)] == r["Correct Answer"]
        assert sorted(p.choices) == sorted([r["Correct Answer"]] + [r[f"Incorrect Answer {k}"]
                                                                    for k in (1, 2, 3)])
    counts = Counter(p.gold for p in first)
    assert set(counts) == set("ABCD") and min(counts.values()) > 25
    assert shuffled_choices("k", "a", ["b", "c", "d"]) == shuffled_choices("k", "a", ["b", "c", "d"])


def test_field_map_renames_local_columns(tmp_path):
    rows = [{"ID": "2024-I-1", "Problem": "Find $1+1$.", "Answer": 2}]
    path = _write(tmp_path, "aime_alt", rows, ".jsonl")
    problems = get_benchmark("aime25").load(path, field_map={"problem": "Problem",
                                                            "answer": "Answer", "id": "ID"})
    assert problems[0].id == "2024-I-1" and problems[0].gold == "2"


def test_synthetic_accepts_generator_records(tmp_path):
    from lorarl.tasks.synthetic import make_splits

    _, evals = make_splits(7, 5, 4)
    recs = [p.record() for p in evals]
    b = get_benchmark("synthetic")
    problems = b.load(rows=recs)
    assert [(p.id, p.prompt, p.gold) for p in problems] == [(r["id"], r["prompt"], r["answer"])
                                                            for r in recs]
    assert b.load(_write(tmp_path, "syn", recs, ".jsonl")) == problems
    with pytest.raises(ValueError):
        b.load()          # no hub id: needs rows or a path


def test_grading_through_benchmarks():
    math = get_benchmark("math500").load(rows=_rows("math500", 2))
    scores = get_benchmark("math500").grade(math, ["so \\boxed{0.75}", "\\boxed{3}"])
    assert [s.correct for s in scores] == [True, False]
    g = get_benchmark("gpqa").load(rows=_rows("gpqa", 1))
    assert get_benchmark("gpqa").grade(g, [f"\\boxed{{{g[0].gold}}}"])[0].correct


def test_errors():
    with pytest.raises(KeyError):
        get_benchmark("nope")
    with pytest.raises(ValueError):
        get_benchmark("aime25").load(rows=[BENCHMARKS["aime25"].example] * 2)  # duplicate ids
    with pytest.raises(ValueError, match="field_map"):
        get_benchmark("gsm8k").load(rows=[{"Question": "q", "answer": "#### 1"}])
    with pytest.raises(ValueError):
        bm.load_rows("data.csv")
    with pytest.raises(ValueError):
        bm.register("gsm8k", hub_id=None, split="x")(lambda r, i: None)


def test_aime22_and_aime23_are_the_years_of_the_pool():
    """Paper 003's separate AIME22 / AIME23 columns: one year each of AI-MO/aimo-validation-aime."""
    pool = [dict(BENCHMARKS["aime22_24"].example, id=i, answer=str(i),
                 url=f"https://artofproblemsolving.com/wiki/index.php/{y}_AIME_{part}_Problems/Problem_{i}")
            for i, (y, part) in enumerate([(2022, "I"), (2023, "II"), (2024, "I"), (2022, "II"), (2023, "I")])]
    assert [p.gold for p in get_benchmark("aime22").load(rows=pool)] == ["0", "3"]
    assert [p.gold for p in get_benchmark("aime23").load(rows=pool)] == ["1", "4"]
    assert len(get_benchmark("aime22_24").load(rows=pool)) == 5
    assert get_benchmark("aime23").load(rows=pool, limit=1)[0].gold == "1"  # limit counts kept rows
    assert get_benchmark("aime22").protocol == BENCHMARKS["aime22_24"].protocol


def test_math500_envelope_is_paper_001_table_2():
    p = BENCHMARKS["math500_envelope"].protocol
    assert (p.n, p.ks, p.max_new_tokens) == (8, (1, 4, 8), 4096)
    assert p.metric_names == ["avg@8", "pass@1", "pass@4", "pass@8"]
    assert BENCHMARKS["math500_envelope"].hub_id == BENCHMARKS["math500"].hub_id
