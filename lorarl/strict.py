"""The one strict base of the study language (:class:`Strict`): unknown fields are errors and numbers are
never booleans, in every section a study YAML may write.

Unknown fields: ``extra="forbid"``, so a typo in a study YAML never silently becomes a default; assignments
are validated too. Numbers: Python's `bool` is an `int`, so pydantic's lax mode reads `rank: true` as rank 1
(and the cell id becomes `True`). One `before` validator on every field refuses a boolean (or a list holding
one) wherever the field's type has a number and no `bool`; the error names the field (pydantic's loc).
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _mentions(ann: Any, kinds: tuple[type, ...]) -> bool:
    """Whether type annotation `ann` has one of `kinds` anywhere (unions, lists, tuples, optionals)."""
    if ann in kinds:
        return True
    return any(_mentions(a, kinds) for a in typing.get_args(ann))


def _has_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(_has_bool(v) for v in value)


class NoBoolNumbers(BaseModel):
    """Refuses `true`/`false` for int/float fields (a `bool`-typed field still takes them)."""

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None or not _has_bool(value):
            return value
        ann = cls.model_fields[info.field_name].annotation
        if _mentions(ann, (int, float)) and not _mentions(ann, (bool,)):
            kind = "an integer" if not _mentions(ann, (float,)) else "a number"
            raise ValueError(f"{value!r} is a boolean; expected {kind} (true/false are not numbers here)")
        return value


class Strict(NoBoolNumbers):
    """The base of every model of the study language: unknown fields are errors, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
