"""The seeds a hypothesis adds at run time, as ordinary cells with stable ids.

The seed axis lists the seeds every setting runs (the fixed design). A hypothesis whose ``max_seeds`` is larger
may add seeds to its two settings, one at a time while its answer is open (lorarl.adaptive.flow): seed values
continue the axis's integers after the largest one (seeds 0, 1, 2 -> 3, 4, ...), and each added seed of a
setting is a cell like any other (its id is what the axes give it, e.g. ``r16-s5``; its own config, signature,
jobs, outputs and MLflow run). The study's cell table (``lorarl cells``, ``CellTable.cells``/``ids``) does not
change: the added cells are found by id (``CellTable.cell``) and listed by ``CellTable.extra_cells``, built on
first use from a copy of the study whose seed axis holds only the added values (so no existing id or hash can
move). Pure: no file is read.
"""

from __future__ import annotations

from typing import Any

from lorarl.language.matrix import Axis, Cell, build_table, label_of

__all__ = ["needed_seeds", "added_values", "added_cells", "seed_labels", "comparison_seeds", "side_of"]


def needed_seeds(study: Any) -> int:
    """The most seeds any hypothesis may use (0 without hypotheses)."""
    return max((h.max_seeds for h in study.hypotheses.values()), default=0)


def _ints(study: Any) -> list[int] | None:
    vals = study.axes[study.seed_axis].values
    try:
        out = [int(v) for v in vals]
    except (TypeError, ValueError):
        return None
    return out if all(float(v) == o for v, o in zip(vals, out)) else None


def added_values(study: Any) -> list[int]:
    """The seed values hypotheses may add: integers after the axis's largest, up to the largest cap."""
    if study.seed_axis not in study.axes:
        return []
    have = len(study.axes[study.seed_axis].values)
    extra = needed_seeds(study) - have
    if extra <= 0:
        return []
    ints = _ints(study)
    if ints is None:
        raise ValueError(f"seed axis {study.seed_axis!r} has non-integer values: seeds cannot be added")
    return list(range(max(ints) + 1, max(ints) + 1 + extra))


def seed_labels(study: Any) -> list[str]:
    """Every seed a comparison may use, in order: the axis's, then the added ones."""
    return [label_of(v) for v in study.axes[study.seed_axis].values] + [str(v) for v in added_values(study)]


def side_of(cell: Any, sel: dict[str, Any]) -> bool:
    """Whether ``cell`` belongs to the setting ``sel`` ({axis: label}) names."""
    return all(cell.axes.get(a) == label_of(v) for a, v in sel.items())


def added_cells(study: Any) -> list[Cell]:
    """The cells of the added seeds of every hypothesis's two settings (empty when none is added)."""
    values = added_values(study)
    if not values:
        return []
    ax = study.axes[study.seed_axis]
    copy = study.model_copy(update={"axes": {**study.axes, study.seed_axis: Axis(field=ax.field, prefix=ax.prefix,
                                                                                    values=values)}})
    table = build_table(copy, "<added seeds>")
    sides = [sel for h in study.hypotheses.values() for sel in (h.a, h.b)]
    return [c for c in table.cells if any(side_of(c, sel) for sel in sides)]


def comparison_seeds(study: Any, table: Any, spec: Any) -> list[tuple[str, str, str]]:
    """(seed label, cell of setting a, cell of setting b) in seed order, up to the hypothesis's cap; stops at
    the first seed a side has no cell for."""
    pool = list(table.cells) + list(table.extra_cells())
    out = []
    for seed in seed_labels(study)[: spec.max_seeds]:
        a = next((c.id for c in pool if c.axes.get(study.seed_axis) == seed and side_of(c, spec.a)), None)
        b = next((c.id for c in pool if c.axes.get(study.seed_axis) == seed and side_of(c, spec.b)), None)
        if a is None or b is None:
            break
        out.append((seed, a, b))
    return out
