"""Settings: a study's cells grouped by everything but the paired axes.

A *setting* is the set of cells that differ only in the paired axes (normally the seed axis): its
rung value is the mean over those cells, and it is kept or stopped as a whole. Settings are listed
in the study's cell order (the order of their first cell: the axes' order, which is also the order
Snakemake lists the jobs); that order is the arrival order of asynchronous successive halving
(lorarl.adaptive.halving), never the wall clock.

Pure: takes the Study and its CellTable (lorarl.language.study), reads no file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Setting", "group", "study_settings", "setting_name", "tie_key", "seed_order"]


@dataclass(frozen=True)
class Setting:
    name: str  # "rank=8,kl=0.05": the non-paired axes' labels (``all`` when every axis is paired)
    labels: tuple[tuple[str, str], ...]  # (axis, label) of the non-paired axes, in axis order
    cells: tuple[str, ...]  # its cell ids, in study order
    paired: tuple[tuple[str, ...], ...]  # per cell: its labels on the paired axes (e.g. ("0",) for seed 0)

    def to_dict(self) -> dict[str, Any]:
        return {"labels": dict(self.labels), "cells": list(self.cells)}


def setting_name(labels: Iterable[tuple[str, str]]) -> str:
    """``rank=8,kl=0.05``; ``all`` when there is no non-paired axis."""
    text = ",".join(f"{a}={lab}" for a, lab in labels)
    return text or "all"


def tie_key(name: str) -> str:
    """The last tie-breaker between settings with equal values at every rung: the sha256 of the name
    (stable, and blind to the axis order, so no axis value is favoured by where it is listed)."""
    return hashlib.sha256(name.encode()).hexdigest()


def group(cells: Iterable[Any], axes: list[str], paired: list[str]) -> list[Setting]:
    """The settings of ``cells`` (each with ``.id`` and ``.axes``: axis -> label), in order of their
    first cell. ``axes``: the study's axes in order; ``paired``: the axes averaged within a setting."""
    free = [a for a in axes if a not in paired]
    order: dict[tuple, list[Any]] = {}
    for c in cells:
        key = tuple((a, c.axes[a]) for a in free)
        order.setdefault(key, []).append(c)
    return [Setting(setting_name(k), k, tuple(c.id for c in cs), tuple(tuple(c.axes[a] for a in paired) for c in cs))
            for k, cs in order.items()]


def study_settings(study: Any, table: Any, paired: list[str] | None = None) -> list[Setting]:
    """The settings of a loaded study (``paired`` default: the study's seed axis)."""
    return group(table.cells, list(study.axes), list(paired or [study.seed_axis]))


def seed_order(study: Any) -> list[str]:
    """The seed axis's labels in the study's order: the order seeds join a sequential comparison."""
    from lorarl.language.matrix import label_of

    return [label_of(v) for v in study.axes[study.seed_axis].values]
