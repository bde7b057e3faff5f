"""Published datasets pinned and read as they really are: task.revision reaches the loader (a hub dataset's
`revision=`, an hf://datasets/ file's address), every published study pins its hub datasets or says in its
fidelity table why it cannot, and paper 004's SimpleRL-Zoo source reads either layout of its file (a top-level
`question` column, as a public loader reads it, or the question inside the struct column extra_info)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

import lorarl.tasks as tasks
from lorarl.language.config import CellConfig
from lorarl.language.task import TaskConfig
from lorarl.language.study import load_study, study_cells
from lorarl.tasks import load_records, task_records
from tests.support.published import PUBLISHED, fidelity_table

ROOT = Path(__file__).resolve().parents[2]
COMMIT = re.compile(r"[0-9a-f]{40}")


def _simplerl(tmp_path: Path, layout: str) -> str:
    """SimpleRL-Zoo-Data's level 3-5 file in one of the two layouts public code reads (one row without a gold)."""
    import pandas as pd

    qs, golds = [f"sr question {i}" for i in range(3)], ["100", "101", ""]
    cols = {"data_source": ["simplelr"] * 3, "prompt": [[{"role": "user", "content": q + " ..."}] for q in qs],
            "reward_model": [{"style": "rule", "ground_truth": g} for g in golds]}
    if layout == "extra_info":
        cols["extra_info"] = [{"question": q, "answer": g} for q, g in zip(qs, golds)]
    else:  # a top-level question column beside the verl fields
        cols["question"] = qs
        cols["extra_info"] = [{"answer": g, "index": i} for i, g in enumerate(golds)]
    path = tmp_path / f"simplerl_{layout}.parquet"
    pd.DataFrame(cols).to_parquet(path)
    return str(path)


@pytest.mark.parametrize("layout", ["top_level_question", "extra_info"])
def test_the_004_simplerl_source_reads_either_layout_of_its_file(tmp_path, layout):
    study = study_cells(load_study(ROOT / "experiments" / "off_principal_masks.yaml"))[0].config.task
    source = next(s for s in study.sources if "SimpleRL" in s.path)
    local = source.model_dump() | {"path": _simplerl(tmp_path, layout), "revision": None}
    rows = task_records(CellConfig(task={"name": "dataset", "sources": [local]}).task)[0]
    assert sorted((r["prompt"], r["answer"]) for r in rows) == [("sr question 0", "100"), ("sr question 1", "101")]


def test_field_alternatives_name_every_path_when_none_is_there(tmp_path):
    path = _simplerl(tmp_path, "extra_info")
    task = TaskConfig(name="dataset", path=path, prompt_field=["question", "problem"], answer_field="extra_info.answer")
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['question or problem'\]; has .*extra_info\.\{answer, question\}"):
        task_records(task)
    ok = TaskConfig(name="dataset", path=path, prompt_field=["question", "extra_info.question"],
                    answer_field="extra_info.answer")
    assert [r["prompt"] for r in task_records(ok)[0]][:2] == ["sr question 0", "sr question 1"]
    for bad in ([], ["question", "question"], [""]):
        with pytest.raises(ValidationError, match="task.prompt_field must be a column path"):
            TaskConfig(name="dataset", path=path, prompt_field=bad)


def test_the_revision_reaches_the_loader(monkeypatch):
    calls = []

    def fake_load(*args, **kw):
        calls.append((args, kw))
        return [{"q": "x"}]

    monkeypatch.setattr("datasets.load_dataset", fake_load)
    load_records("org/name", "train", "0123abc", "main")
    assert calls[-1] == (("org/name", "main"), {"split": "train", "revision": "0123abc"})
    load_records("hf://datasets/openai/gsm8k/main/train-00000-of-00001.parquet", "train", "e53f0488")
    assert calls[-1] == (("parquet",), {"data_files": "hf://datasets/openai/gsm8k@e53f0488/main/train-00000-of-00001.parquet",
                                        "split": "train"})
    load_records("hf://datasets/openai/gsm8k/main/train-00000-of-00001.parquet", "train", None)
    assert calls[-1][1]["data_files"] == "hf://datasets/openai/gsm8k/main/train-00000-of-00001.parquet"
    assert tasks.pinned_address("hf://datasets/a/b/x.jsonl", "refs/pr/1") == "hf://datasets/a/b@refs%2Fpr%2F1/x.jsonl"


@pytest.mark.parametrize("task, match", [
    ({"path": "data/local.jsonl", "revision": "abc"}, r"task.revision pins a hub dataset or a file inside one"),
    ({"path": "hf://datasets/a/b@v1/x.parquet", "revision": "abc"}, r"already pins a revision"),
    ({"path": "a/b", "revision": "two words"}, r"task.revision 'two words' must be a commit hash, tag or branch"),
    ({"path": "hf://datasets/a/b/x.parquet", "config": "main"}, r"task.config applies to a hub dataset"),
])
def test_a_bad_revision_is_refused_naming_the_field(task, match):
    with pytest.raises(ValidationError, match=match):
        TaskConfig(name="dataset", **task)


def _hub_datasets(cell) -> list[tuple[str, str | None]]:
    """(path, revision) of every hub dataset (id, folder or hf:// file) a cell trains on."""
    t = cell.config.task
    if t.name != "dataset":
        return []
    found = [(s.path, s.revision) for s in t.sources] if t.sources else [(t.path, t.revision)]
    return [(p, r) for p, r in found if p.startswith("hf://") or not Path(p).suffix]


@pytest.mark.parametrize("path", [p for p in PUBLISHED if p.stem != "kl_bound_toy"], ids=lambda p: p.stem)
def test_every_published_dataset_is_pinned_or_says_why_not(path):
    """A study is the same study next year: each hub dataset carries a commit hash, or the fidelity table's data
    row says plainly that no revision of it was found (never an invented hash)."""
    data = " ".join(fidelity_table(path)["data"])
    for cell in study_cells(load_study(path)):
        for dataset, revision in _hub_datasets(cell):
            name = dataset.removeprefix("hf://datasets/").split("/")[1].split("@")[0]
            if revision is None:
                assert re.search(rf"{re.escape(name)} NOT pinned", data), f"{path.name} {cell.id}: {dataset} unpinned"
            else:
                assert COMMIT.fullmatch(revision) and revision in data, f"{path.name} {cell.id}: {dataset} {revision}"
