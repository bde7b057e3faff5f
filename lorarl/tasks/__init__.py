"""Training prompts + gold answers for a cell: the synthetic task or a real dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from lorarl.tasks.fields import describe_fields, field_value, missing_fields
from lorarl.tasks.synthetic import make_splits

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")  # a local (or hf://) file: no hub config (a revision: hf:// files only)
HUB_FILE = "hf://datasets/"  # a file inside a hub dataset: hf://datasets/<org>/<name>[@<rev>]/<file>


def pinned_address(path: str, revision: str | None) -> str:
    """``hf://datasets/<org>/<name>/<file>`` at ``revision`` (``<name>@<rev>``, URL-quoted); other paths unchanged."""
    if revision is None or not path.startswith(HUB_FILE):
        return path
    org, name, rest = path[len(HUB_FILE):].split("/", 2)
    return f"{HUB_FILE}{org}/{name}@{quote(revision, safe='')}/{rest}"


def load_records(path: str, split: str = "train", revision: str | None = None,
                 config: str | None = None) -> list[dict]:
    """Rows of a local (or ``hf://``) .jsonl/.parquet file, or of a hub dataset (id or folder) by
    ``load_dataset`` with its configuration and revision (a hub file's revision goes into its address)."""
    import datasets

    if path.startswith(HUB_FILE) and path.endswith(FILE_SUFFIXES):
        path, revision = pinned_address(path, revision), None
    p = Path(path)  # the address itself goes to the loader: Path would fold hf://datasets/... into hf:/datasets/...
    if p.suffix in (".jsonl", ".json"):
        ds = datasets.load_dataset("json", data_files=path, split="train")
    elif p.suffix == ".parquet":
        ds = datasets.load_dataset("parquet", data_files=path, split="train")
    else:
        ds = datasets.load_dataset(path, config, split=split, revision=revision)
    return [dict(r) for r in ds]


def task_records(task: Any) -> tuple[list[dict], list[dict]]:
    """(train, eval) lists of {id, prompt, answer} of a cell's ``task:`` section (lorarl.language.task.TaskConfig,
    handed in: the study language reads this package, never the other way)."""
    if task.name == "synthetic":
        train, evals = make_splits(
            task.seed, task.n_train, task.n_eval, task.min_operands, task.max_operands, task.max_value
        )
        return [p.record() for p in train], [p.record() for p in evals]
    if task.sources is not None:  # a mixture of datasets, each with its own columns (lorarl.tasks.mixture)
        from lorarl.tasks.mixture import mixture_records

        return mixture_records(task, load_records), []
    rows = load_records(task.path, task.split, task.revision, task.config)
    missing = missing_fields(rows[0] if rows else {}, [task.prompt_field, task.answer_field])
    if missing:
        raise ValueError(f"dataset {task.path} lacks field(s) {missing}; has {describe_fields(rows[0] if rows else {})}")
    prompts = [str(field_value(r, task.prompt_field)) for r in rows]
    if task.unwrap:  # the bare problem out of the dataset's instructed message (the cell's template asks)
        from lorarl.tasks.prompt import unwrap

        prompts = unwrap(task.unwrap, prompts)
    recs = [{"id": f"{task.split}-{i}", "prompt": p, "answer": str(field_value(r, task.answer_field))}
            for i, (p, r) in enumerate(zip(prompts, rows))]
    return recs, []
