"""Dataset mixtures (task.sources): two local datasets, one in DeepScaleR's schema (problem / answer /
solution, .jsonl) and one in SimpleRL-Zoo-Data's verl layout (.parquet: data_source, a chat `prompt`,
reward_model.ground_truth and the bare question and gold in the struct column extra_info, read as
extra_info.question / extra_info.answer; one row without a gold answer, as the release has), mixed by
count and by weight; deterministic given task.seed; validated; in the training signature."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from lorarl.language.config import CellConfig
from lorarl.language.task import TaskConfig
from lorarl.language.signature import signature_dump, train_signature
from lorarl.tasks import task_records
from tests.support.study import seeds, tiny_study

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_sources(tmp_path):
    """(DeepScaleR-schema .jsonl with 6 rows, SimpleRL-Zoo-schema .parquet with 3 rows with a gold answer
    and one without)."""
    import pandas as pd

    ds = tmp_path / "deepscaler.jsonl"
    ds.write_text("".join(json.dumps({"problem": f"ds problem {i}", "answer": str(i),
                                      "solution": f"... so \\boxed{{{i}}}"}) + "\n" for i in range(6)))
    sr = tmp_path / "simplerl.parquet"
    qs, golds = [f"sr question {i}" for i in range(4)], [f"{100 + i}" for i in range(3)] + [""]
    pd.DataFrame({"data_source": ["simplelr"] * 4,
                  "prompt": [[{"role": "user", "content": f"{q}\nPlease reason step by step, and put your final "
                                                          "answer within \\boxed{}."}] for q in qs],
                  "ability": ["math"] * 4,
                  "reward_model": [{"style": "rule", "ground_truth": g} for g in golds],
                  "extra_info": [{"question": q, "answer": g} for q, g in zip(qs, golds)]}).to_parquet(sr)
    return str(ds), str(sr)


def src(path, **kw):
    cols = ({"prompt_field": "problem", "answer_field": "answer"} if path.endswith(".jsonl")
            else {"prompt_field": "extra_info.question", "answer_field": "extra_info.answer"})
    return {"path": path, **cols, **kw}


def mix(sources, **kw) -> TaskConfig:
    return CellConfig(task={"name": "dataset", "sources": sources, **kw}).task


def rows_of(task):
    return task_records(task)[0]


def test_mixture_by_count_reads_each_source_with_its_own_columns(two_sources):
    ds, sr = two_sources
    rows = rows_of(mix([src(ds, count=4), src(sr, count="all")]))
    kinds = Counter(r["prompt"].split()[0] for r in rows)
    assert kinds == {"ds": 4, "sr": 3}
    for r in rows:  # each prompt keeps its own gold answer
        n = r["prompt"].split()[-1]
        assert r["answer"] == (n if r["prompt"].startswith("ds") else str(100 + int(n)))
    assert len({r["prompt"] for r in rows}) == 7  # a count draws without repeats
    assert {r["prompt"] for r in rows if r["prompt"].startswith("sr")} == {f"sr question {i}" for i in range(3)}
    assert [r["prompt"][:2] for r in rows] != sorted(r["prompt"][:2] for r in rows)  # interleaved, not stacked


def test_mixture_is_deterministic_given_the_data_seed(two_sources):
    ds, sr = two_sources
    sources = [src(ds, count=3), src(sr, count=2)]
    once, again = rows_of(mix(sources)), rows_of(mix(sources))
    assert once == again
    other = [rows_of(mix(sources, seed=s)) for s in range(5)]
    assert any([r["prompt"] for r in o] != [r["prompt"] for r in once] for o in other)


def test_mixture_by_weight_apportions_mix_size_and_repeats_a_small_source(two_sources):
    ds, sr = two_sources
    rows = rows_of(mix([src(ds, weight=1.0), src(sr, weight=2.0)], mix_size=12))
    got = Counter(r["prompt"].split()[0] for r in rows)
    assert got == {"ds": 4, "sr": 8}  # 12 x 1/3 and 12 x 2/3
    sr_counts = Counter(r["prompt"] for r in rows if r["prompt"].startswith("sr"))
    assert sorted(sr_counts.values()) == [2, 3, 3]  # 8 of 3 rows: two whole copies + 2 drawn
    default = rows_of(mix([src(ds, weight=1.0), src(sr, weight=1.0)]))  # mix_size null: 6 + 3 rows
    assert Counter(r["prompt"].split()[0] for r in default) == {"ds": 5, "sr": 4}  # 4.5 / 4.5: tie to the first


def test_per_source_unwrap(tmp_path, two_sources):
    from lorarl.tasks.prompt import DAPO_TEMPLATE

    ds, _ = two_sources
    wrapped = tmp_path / "dapo.jsonl"
    wrapped.write_text(json.dumps({"prompt": DAPO_TEMPLATE.replace("{question}", "what is 7?"),
                                   "solution": "7"}) + "\n")
    rows = rows_of(mix([src(ds, count=1), {"path": str(wrapped), "answer_field": "solution", "unwrap": "dapo",
                                           "count": "all"}]))
    assert {"prompt": "what is 7?", "answer": "7"} in [{k: r[k] for k in ("prompt", "answer")} for r in rows]


@pytest.mark.parametrize("sources, extra, match", [
    ([{"path": "a.jsonl"}], {}, "either weight .* or count"),
    ([{"path": "a.jsonl", "weight": 1.0, "count": 3}], {}, "either weight .* or count"),
    ([{"path": "a.jsonl", "weight": 0}], {}, "greater than 0"),
    ([{"path": "a.jsonl", "weight": -2.0}], {}, "greater than 0"),
    ([{"path": "a.jsonl", "count": 0}], {}, "positive number of rows or all"),
    ([{"path": "a.jsonl", "count": "most"}], {}, "count"),
    ([{"path": "a.jsonl", "count": True}], {}, "boolean"),
    ([{"path": "a.jsonl", "weight": 1.0}, {"path": "b.jsonl", "count": 2}], {}, "mixes weight and count"),
    ([{"path": "a.jsonl", "count": 2}, {"path": "a.jsonl", "count": 3}], {}, r"task.sources\[1\] repeats"),
    ([{"path": "a.jsonl", "count": 2}], {"mix_size": 10}, "task.mix_size applies to a mixture by weight"),
    ([{"path": "a.jsonl", "count": 2}], {"path": "b.jsonl"}, "leave task.path unset"),
    ([{"path": "a.jsonl", "count": 2}], {"answer_field": "gt"}, "leave task.answer_field unset"),
    ([{"path": "a.jsonl", "count": 2, "config": "main"}], {}, "hub dataset"),
    ([{"path": "a.jsonl", "count": 2, "shard": 1}], {}, "Extra inputs"),
    ([], {}, "at least 1"),
])
def test_mixture_is_validated(sources, extra, match):
    with pytest.raises(ValidationError, match=match):
        mix(sources, **extra)


def test_mixture_needs_a_dataset_task():
    with pytest.raises(ValidationError, match="task.sources applies to task.name 'dataset'"):
        CellConfig(task={"sources": [{"path": "a.jsonl", "count": 1}]})
    with pytest.raises(ValidationError, match=r"task.path \(one dataset\) or task.sources"):
        CellConfig(task={"name": "dataset"})


def test_load_errors_name_the_source(two_sources):
    ds, sr = two_sources
    with pytest.raises(ValueError, match=r"task.sources\[1\].count 5 exceeds the 3 rows"):
        rows_of(mix([src(ds, count=1), src(sr, count=5)]))
    with pytest.raises(ValueError, match=r"task.sources\[1\] .* lacks field\(s\) \['answer'\]; "
                                         r"has .*extra_info\.\{answer, question\}"):
        rows_of(mix([src(ds, count=1), {"path": sr, "prompt_field": "extra_info.question", "count": 1}]))
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['extra_info.gold'\]"):
        rows_of(mix([src(ds, count=1), src(sr, answer_field="extra_info.gold", count=1)]))


def test_signature_has_the_sources_and_leaves_one_dataset_tasks_alone(two_sources):
    ds, sr = two_sources
    one = CellConfig(task={"name": "dataset", "path": ds, "prompt_field": "problem"})
    assert not {"sources", "mix_size"} & set(signature_dump(one)["task"])  # old cells keep their hash
    base = [src(ds, count=3), src(sr, count="all")]
    hashes = {train_signature(CellConfig(task={"name": "dataset", "sources": s, **kw}))
              for s, kw in [(base, {}),
                            ([src(ds, count=4), base[1]], {}),  # a count
                            ([base[0], {**base[1], "answer_field": "level"}], {}),  # a column
                            ([base[0], {**base[1], "path": sr + ".x.parquet"}], {}),  # a path
                            ([base[1], base[0]], {}),  # the order (source i's draw is seeded by i)
                            (base, {"seed": 7})]}  # the data seed
    assert len(hashes) == 6


def test_hf_file_address_reaches_the_loader_unchanged(monkeypatch):
    import datasets

    from lorarl.tasks import load_records

    seen = {}

    def fake(kind, data_files=None, split=None, **kw):
        seen.update(kind=kind, data_files=data_files)
        return [{"question": "q", "gt_answer": "1"}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    url = "hf://datasets/hkust-nlp/SimpleRL-Zoo-Data/simplelr_qwen_level3to5/train.parquet"
    assert load_records(url) == [{"question": "q", "gt_answer": "1"}]
    assert seen == {"kind": "parquet", "data_files": url}


def test_a_missing_local_source_file_is_reported_before_anything_runs(tmp_path, two_sources):
    from lorarl.language.matrix import StudyError
    from lorarl.language.study import load_study, study_cells

    ds, _ = two_sources
    study = tmp_path / "mix.yaml"
    sources = [src(ds, count=1), src(str(tmp_path / "nope.parquet"), count=1)]
    study.write_text(json.dumps(tiny_study("mix", adapter=None, train=None, model="local:tiny-arith",
                                           eval={"benchmarks": ["gsm8k"]}, task={"name": "dataset", "sources": sources},
                                           axes=seeds(0))))
    with pytest.raises(StudyError, match=r"task.sources\[1\].path: no such file"):
        study_cells(load_study(str(study)))


def test_paper_004_masks_study_trains_on_ds_plus_sr():
    from lorarl.language.study import load_study, study_cells

    for cell in study_cells(load_study(str(ROOT / "experiments" / "off_principal_masks.yaml"))):
        srcs = cell.config.task.sources
        assert [s.path for s in srcs] == ["agentica-org/DeepScaleR-Preview-Dataset",
                                          "hf://datasets/hkust-nlp/SimpleRL-Zoo-Data/simplelr_qwen_level3to5/train.parquet"]
        assert [s.count for s in srcs] == ["all", "all"] and cell.config.task.path is None
        assert [(s.prompt_field, s.answer_field) for s in srcs] == [  # SimpleRL: either layout (test_dataset_pins.py)
            ("problem", "answer"), (["question", "extra_info.question"], "extra_info.answer")]


def test_one_dataset_task_reads_a_struct_column_by_a_dotted_field(two_sources):
    _, sr = two_sources
    task = CellConfig(task={"name": "dataset", "path": sr, "prompt_field": "extra_info.question",
                            "answer_field": "reward_model.ground_truth"}).task
    rows = rows_of(task)
    assert [(r["prompt"], r["answer"]) for r in rows[:3]] == [(f"sr question {i}", f"{100 + i}") for i in range(3)]
