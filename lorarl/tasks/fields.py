"""A dataset row's field by a dotted path: ``question`` (a column) or ``extra_info.question`` (a key of a
struct column, as verl-format parquet files such as SimpleRL-Zoo-Data keep the question and gold answer)."""

from __future__ import annotations

from typing import Any


def has_field(row: dict, path: str) -> bool:
    """True when every step of ``path`` exists in ``row`` (nested dicts)."""
    node: Any = row
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def field_value(row: dict, path: str) -> Any:
    """The value at ``path`` (checked beforehand with :func:`has_field`)."""
    node: Any = row
    for key in path.split("."):
        node = node[key]
    return node


def missing_fields(row: dict, paths: list[str]) -> list[str]:
    """The paths of ``paths`` that ``row`` lacks, in order, once each."""
    return [p for p in dict.fromkeys(paths) if not has_field(row, p)]


def describe_fields(row: dict) -> list[str]:
    """The row's columns, struct columns listed with their keys (``extra_info.{answer, question}``),
    for an error message that shows what to write in ``prompt_field`` / ``answer_field``."""
    return [f"{k}.{{{', '.join(sorted(v))}}}" if isinstance(v, dict) else k for k, v in sorted(row.items())]
