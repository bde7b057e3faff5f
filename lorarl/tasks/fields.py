"""A dataset row's field by a dotted path: ``question`` (a column) or ``extra_info.question`` (a key of a
struct column, as verl-format parquet files such as SimpleRL-Zoo-Data keep the question and gold answer).

A field may also be a list of paths, alternatives tried in order on each row (``[question,
extra_info.question]``): the study then reads whichever layout the file really has."""

from __future__ import annotations

from typing import Any

FieldSpec = str | list[str]  # one dotted path, or alternatives in order


def alternatives(spec: FieldSpec) -> list[str]:
    """The dotted paths a field spec tries, in order."""
    return [spec] if isinstance(spec, str) else list(spec)


def has_field(row: dict, path: str) -> bool:
    """True when every step of ``path`` exists in ``row`` (nested dicts)."""
    node: Any = row
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def field_value(row: dict, spec: FieldSpec) -> Any:
    """The value at the first path of ``spec`` that ``row`` has (checked beforehand with :func:`missing_fields`)."""
    paths = alternatives(spec)
    path = next((p for p in paths if has_field(row, p)), paths[0])
    node: Any = row
    for key in path.split("."):
        node = node[key]
    return node


def missing_fields(row: dict, specs: list[FieldSpec]) -> list[str]:
    """The specs of ``specs`` none of whose paths ``row`` has, in order, once each (alternatives joined by 'or')."""
    out: list[str] = []
    for spec in specs:
        paths = alternatives(spec)
        name = " or ".join(paths)
        if not any(has_field(row, p) for p in paths) and name not in out:
            out.append(name)
    return out


def describe_fields(row: dict) -> list[str]:
    """The row's columns, struct columns listed with their keys (``extra_info.{answer, question}``),
    for an error message that shows what to write in ``prompt_field`` / ``answer_field``."""
    return [f"{k}.{{{', '.join(sorted(v))}}}" if isinstance(v, dict) else k for k, v in sorted(row.items())]
