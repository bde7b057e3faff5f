"""The cell matrix of a study: axis values → cells (id, resolved config, signatures) → a CellTable.

Built once per study per process by :func:`lorarl.language.study.cell_table` (use that, not this module):
expansion, validation, registry-default resolution, merging and hashing happen here, once; every
lookup afterwards (`CellTable.cell`, `.ids`, `.bases`, `.eval_signature`) is a dictionary access.

First the axes' sizes are multiplied: a study past the cell cap ($LORARL_MAX_CELLS, default
100,000; `check_size`) is refused before any cell is expanded, naming each axis's size and the cap.
Per cell, in order: the axis values are written into the defaults (a field may be written by one
axis only: lorarl.language.study checks that); fields that do not apply to the cell's method are dropped
(study kind hook); the config is validated (errors name `axes.<name>.values[<i>] = <value>` or
`defaults.<field>`); the method's registry defaults are filled in; the signatures are computed
(lorarl.language.signature); identical configs merge into the first id.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
import typing
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from lorarl.language.kinds import Kind, get_kind
from lorarl.language.signature import signatures
from lorarl.strict import Strict

_SAFE = re.compile(r"[^A-Za-z0-9._+-]")
MAX_CELLS_ENV = "LORARL_MAX_CELLS"  # the cap on a study's cells (runtime setting, not science)
MAX_CELLS = 100_000  # its default: published studies have at most a few hundred cells
NOT_APPLICABLE = "n/a"  # axis label of a cell whose method the axis does not apply to


class StudyError(ValueError):
    """A study YAML is invalid; the message names the field and the allowed values."""


class Bundle(Strict):
    label: str  # how this value appears in cell ids, tags and tables
    set: dict[str, Any] = Field(min_length=1)  # dotted path -> value, applied together


class Axis(Strict):
    field: str | None = None  # dotted path set by scalar values (bundles name their own)
    prefix: str = ""  # id fragment before each label, e.g. "r" -> r16
    values: list[Any] = Field(min_length=1)  # scalars or bundles, in display order

    @model_validator(mode="after")
    def _check(self) -> "Axis":
        for i, v in enumerate(self.values):
            if isinstance(v, dict):
                try:
                    self.values[i] = Bundle.model_validate(v)
                except ValidationError as err:  # name the value: `values[1]: label: Field required`
                    why = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in err.errors())
                    raise ValueError(f"values[{i}] is not a bundle {{label, set}}: {why}") from None
            elif self.field is None:
                raise ValueError(f"values[{i}]={v!r} is a scalar but the axis has no `field`; allowed: a `field` "
                                 f"for scalar values, or bundles {{label, set}}")
        return self

    def writes(self) -> list[list[tuple[str, Any]]]:
        """Per value: the (dotted path, value) pairs it sets."""
        return [list(v.set.items()) if isinstance(v, Bundle) else [(self.field, v)] for v in self.values]


@dataclass(frozen=True)
class Cell:
    id: str  # readable, deterministic, filesystem-safe, e.g. r16-kl0.05-s1
    axes: dict[str, str]  # axis name -> label of the value this cell takes ("n/a": does not apply)
    config: Any  # the fully resolved config (CellConfig, or ToyCellConfig for toy studies)
    hash: str  # training signature of the resolved config: change a setting that trains, the cell reruns
    aliases: tuple[str, ...] = field(default=())  # other ids that name this cell (merged or shortened)
    eval_hash: str = ""  # signature of the evaluation-only settings (lorarl.language.signature)

    def flat_config(self) -> dict[str, Any]:
        return flatten(self.config.model_dump(mode="json"))


def label_of(value: Any) -> str:
    if isinstance(value, Bundle):
        return value.label
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(value) if value != 0 else "0"
    return str(value)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


class CellTable:
    """Every cell of one study, resolved and signed once; lookups are dictionary accesses."""

    def __init__(self, study: Any, cells: list[Cell], bases: list[Cell], notes: list[str], merged: int = 0):
        self.study = study  # the Study this table expands
        self.cells = cells  # matrix cells in axis order
        self.bases = bases  # base pseudo-cells (the untrained model, one per model and prompt: lorarl.language.evalplan.bases)
        self.notes = notes  # human-readable merges/drops, printed by `lorarl cells`
        self.merged = merged  # how many expanded combos merged into an identical earlier cell
        self.ids = [c.id for c in cells]
        self.base_ids = [b.id for b in bases]
        self._base_set = frozenset(self.base_ids)
        self._by_id: dict[str, Cell] = {c.id: c for c in bases + cells}
        for c in cells:
            for a in c.aliases:
                self._by_id.setdefault(a, c)
        self._eval_sigs: dict[tuple[str, str, int | None], str] = {}
        self.extra_source: typing.Callable[[], list[Cell]] | None = None  # cells outside the matrix (seeds a hypothesis adds)
        self._extra: list[Cell] | None = None

    def extra_cells(self) -> list[Cell]:
        """Cells the study may add at run time, found by id but not in ``cells``/``ids`` (so `lorarl cells`
        and every id stay as they are): the seeds a hypothesis adds (lorarl.language.adaptive.seeds). Built on first use."""
        if self._extra is None:
            self._extra = list(self.extra_source()) if self.extra_source is not None else []
            for c in self._extra:
                self._by_id.setdefault(c.id, c)
        return self._extra

    def __len__(self) -> int:
        return len(self.cells)

    def cell(self, cell_id: str) -> Cell:
        """A matrix cell (by id or alias) or a base pseudo-cell."""
        if cell_id not in self._by_id and self._extra is None:
            self.extra_cells()
        try:
            return self._by_id[cell_id]
        except KeyError:
            ids = self.ids + self.base_ids
            shown = ", ".join(ids[:20]) + (f", ... ({len(ids)} in all)" if len(ids) > 20 else "")
            raise StudyError(f"no cell {cell_id!r} in study {self.study.name}; cells: {shown}") from None

    def is_base(self, cell_id: str) -> bool:
        return cell_id in self._base_set

    def eval_signature(self, cell_id: str, benchmark: str, step: int | None = None) -> str:
        """Rerun trigger of one evaluation (lorarl.language.evalplan.plan.eval_signature), memoised."""
        key = (cell_id, benchmark, step)
        if key not in self._eval_sigs:
            from lorarl.language.evalplan.plan import eval_signature

            self._eval_sigs[key] = eval_signature(self.cell(cell_id).config, benchmark, step, self.is_base(cell_id))
        return self._eval_sigs[key]


def _show(v: Any) -> str:
    return v.label if isinstance(v, Bundle) else json.dumps(v) if isinstance(v, str) else str(v)


def _check_path(base: dict, path: str, where: str, source: str) -> None:
    node: Any = base
    keys = path.split(".")
    for k in keys[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(k), dict):
            raise StudyError(f"invalid study {source}: {where} sets `{path}`, but `{k}` is not a config section")
        node = node[k]
    if keys[-1] not in node:
        raise StudyError(f"invalid study {source}: {where} sets unknown field `{path}`; "
                         f"allowed here: {', '.join(sorted(node))}")


def _put(d: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value


def _cell_error(err: ValidationError, labels: dict[str, str], origin: dict[str, tuple[str, int, Any]],
                source: str) -> str:
    """Name the axis value behind each error (`axes.<name>.values[<i>] = <value>: <reason>`), else the
    defaults field."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ") + _bool_hint(e)
        hits = {f"axes.{n}.values[{i}] = {_show(v)}": None for p, (n, i, v) in origin.items()
                if loc and (p == loc or p.startswith(loc + ".") or loc.startswith(p + "."))}
        if hits:
            names = ", ".join(hits)
            lines.append(f"  {names}: {loc}: {msg}")
        else:
            lines.append(f"  defaults.{loc or '<root>'}: {msg}")
    where = ", ".join(f"{k}={v}" for k, v in labels.items())
    return f"invalid study {source}: cell ({where}) is not a valid config:\n" + "\n".join(lines)


def _cell_id(study: Any, labels: dict[str, str], names: list[str]) -> str:
    frags = (_SAFE.sub("_", f"{study.axes[n].prefix}{labels[n]}").strip("_.") for n in names)
    return "-".join(frags) or "cell"


def _bases(kind: Kind, cells: list[Cell], study: Any = None) -> list[Cell]:
    """Base pseudo-cells: one per model and base evaluation signature (prompt, ...): lorarl.language.evalplan.bases."""
    if not kind.has_base:
        return []
    from lorarl.language.evalplan.bases import base_cells

    return base_cells(study, cells, Cell)


def max_cells() -> int:
    """The cell cap: $LORARL_MAX_CELLS, else MAX_CELLS."""
    raw = os.environ.get(MAX_CELLS_ENV, "").strip()
    if not raw:
        return MAX_CELLS
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise StudyError(f"{MAX_CELLS_ENV}={raw!r}: allowed: a positive whole number of cells (default {MAX_CELLS:,})")
    return value


def check_size(study: Any, source: str = "<study>") -> int:
    """Refuse a study whose axes multiply past the cell cap, before any cell is expanded; returns the count."""
    sizes = {n: len(ax.values) for n, ax in study.axes.items()}
    total = math.prod(sizes.values())
    cap = max_cells()
    if total > cap:
        shown = " x ".join(f"axes.{n} ({k:,})" for n, k in sizes.items())
        raise StudyError(f"invalid study {source}: the axes multiply to {total:,} cells: {shown}; allowed: at most "
                         f"{cap:,} cells (before exclude): fewer axis values, or raise the cap with "
                         f"{MAX_CELLS_ENV}=<cells> in the environment if the study is meant to be that large")
    return total


def build_table(study: Any, source: str = "<study>") -> CellTable:
    """Expand, validate, resolve, sign and merge every cell of ``study`` (a lorarl.language.study.Study)."""
    check_size(study, source)
    kind = get_kind(study.kind)
    cls = kind.config()
    names = list(study.axes)
    writes = {n: study.axes[n].writes() for n in names}
    try:
        base = kind.base(cls, study.defaults, {p for n in names for sets in writes[n] for p, _ in sets})
    except ValidationError as err:
        raise StudyError(f"invalid study {source}:\n{format_validation(err, 'defaults.', cls)}") from None
    for n in names:
        for i, sets in enumerate(writes[n]):
            where = f"axes.{n}.field" if not isinstance(study.axes[n].values[i], Bundle) else f"axes.{n}.values[{i}]"
            for path, _ in sets:
                _check_path(base, path, where, source)
    base_blob = json.dumps(base)
    resolve_cache: dict = {}
    cells: dict[str, Cell] = {}
    by_ident: dict[str, str] = {}
    drops: dict[str, dict] = {}  # surviving id -> {"fields": [...], "method": m, "n": combos}
    merged = 0  # combos merged into an earlier identical cell
    for combo in itertools.product(*(range(len(study.axes[n].values)) for n in names)):
        labels = {n: label_of(study.axes[n].values[i]) for n, i in zip(names, combo)}
        if any(all(labels[a] == str(lab) for a, lab in rule.items()) for rule in study.exclude):
            continue
        raw = json.loads(base_blob)
        origin: dict[str, tuple[str, int, Any]] = {}
        for n, i in zip(names, combo):
            for path, val in writes[n][i]:
                _put(raw, path, val)
                origin[path] = (n, i, study.axes[n].values[i])
        method, dropped = kind.inapplicable(raw, {p: o[0] for p, o in origin.items()})
        try:
            cfg = kind.resolve(cls.model_validate(raw), resolve_cache)
        except ValidationError as err:
            raise StudyError(_cell_error(err, labels, origin, source)) from None
        except ValueError as err:  # a registry check outside pydantic
            raise StudyError(f"invalid study {source}: cell {labels}: {err}") from None
        gone = [n for n, i in zip(names, combo) if writes[n][i] and all(p in dropped for p, _ in writes[n][i])]
        full_id = _cell_id(study, labels, names)
        cid = _cell_id(study, labels, [n for n in names if n not in gone])
        shown = {n: (NOT_APPLICABLE if n in gone else lab) for n, lab in labels.items()}
        ident, sig, ev_sig = signatures(cfg)
        if ident in by_ident:  # identical resolved config: keep the first id, remember the others
            first = cells[by_ident[ident]]
            extra = tuple(a for a in dict.fromkeys((cid, full_id)) if a != first.id and a not in first.aliases)
            cells[first.id] = Cell(first.id, first.axes, first.config, first.hash, first.aliases + extra,
                                   first.eval_hash)
            merged += 1
            if first.id in drops:
                drops[first.id]["n"] += 1
            continue
        if cid in cells:
            raise StudyError(f"invalid study {source}: two cells share the id {cid!r}; use distinct labels")
        by_ident[ident] = cid
        cells[cid] = Cell(cid, shown, cfg, sig, (full_id,) if full_id != cid else (), ev_sig)
        if dropped:
            drops[cid] = {"fields": [p.split(".")[-1] for p in dropped], "method": method, "n": 1}
    if not cells:
        raise StudyError(f"invalid study {source}: every cell is excluded; allowed: exclude rules that "
                         f"leave at least one cell")
    out = list(cells.values())
    notes = []
    for cid, d in drops.items():
        what = ", ".join(d["fields"]) + (" do" if len(d["fields"]) > 1 else " does")
        how = f"{d['n']} cells merged into {cid}" if d["n"] > 1 else f"dropped from {cid}"
        notes.append(f"{what} not apply to {d['method']}: {how}")
    try:
        bases = _bases(kind, out, study)
    except ValueError as err:  # an evaluation plan that cannot be honoured (EvalPlanError names the field)
        raise StudyError(f"invalid study {source}: {err}") from None
    return CellTable(study, out, bases, notes, merged)


def _fields_at(model: Any, loc: tuple) -> list[str]:
    """The field names a pydantic model accepts at `loc` (nested models followed; [] if unknown)."""
    parts = list(loc)
    while parts:
        f = getattr(model, "model_fields", {}).get(parts.pop(0))
        ann = getattr(f, "annotation", None)
        if typing.get_origin(ann) is dict and parts:  # dict[str, Model]: skip the key (e.g. an axis name)
            ann = typing.get_args(ann)[1]
            parts.pop(0)
        models = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1 and type(None) in typing.get_args(ann):  # `Model | None`: the model's fields
            ann = models[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(getattr(model, "model_fields", {}))


def _bool_hint(e: Any) -> str:
    """The value given and the allowed ones, which pydantic's message for a bad boolean names neither of."""
    return f" (got {e['input']!r}; allowed: true, false)" if e["type"] in ("bool_parsing", "bool_type") else ""


def format_validation(err: ValidationError, where: str, model: Any = None) -> str:
    """One line per pydantic error: `<where><field>: <message>` (unknown fields: + the allowed ones)."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(model, tuple(e["loc"][:-1])) if model is not None else []
            msg = "unknown field" + (f"; allowed here: {', '.join(allowed)}" if allowed else "")
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e['input']!r})"
        msg += _bool_hint(e)
        lines.append(f"  {where}{loc}: {msg}")
    return "\n".join(lines)
