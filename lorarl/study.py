"""A study = defaults + ordered axes → a matrix of cells (id, resolved config, hash).

YAML shape (see experiments/demo.yaml):

    name: demo
    defaults: {...a full CellConfig, partially given...}
    axes:
      rank:                       # axis name: an MLflow tag and a table column
        field: adapter.rank       # dotted path that scalar values set
        prefix: r                 # id fragment: r1, r8 ...
        values: [1, 8, {label: full, set: {adapter.method: full, train.lr: 1.0e-5}}]
    exclude:
      - {rank: full, kl: 0.05}    # drop cells matching all listed axis labels

A bundle value (`{label, set}`) sets several fields at once, so "ranks plus full fine-tuning" is
one axis without nonsense cells. Cells whose resolved configs are identical are merged.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lorarl.config import CellConfig

_SAFE = re.compile(r"[^A-Za-z0-9._+-]")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class StudyError(ValueError):
    """A study YAML is invalid; the message names the field and the allowed values."""


class Bundle(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str  # how this value appears in cell ids, tags and tables
    set: dict[str, Any] = Field(min_length=1)  # dotted path -> value, applied together


class Axis(BaseModel):
    model_config = ConfigDict(extra="forbid")
    field: str | None = None  # dotted path set by scalar values (bundles name their own)
    prefix: str = ""  # id fragment before each label, e.g. "r" -> r16
    values: list[Any] = Field(min_length=1)  # scalars or bundles, in display order

    @model_validator(mode="after")
    def _check(self) -> "Axis":
        for i, v in enumerate(self.values):
            if isinstance(v, dict):
                self.values[i] = Bundle.model_validate(v)
            elif self.field is None:
                raise ValueError(f"values[{i}]={v!r} is a scalar but the axis has no `field`")
        return self


def _toy_config():
    from lorarl.toy.cells import ToyCellConfig

    return ToyCellConfig


# Study kinds: which cell config class the defaults and axes resolve into.
KINDS = {"grpo": lambda: CellConfig, "kl_bound_toy": _toy_config}


class Study(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str  # MLflow experiment name and results/<name>/ folder
    kind: Literal["grpo", "kl_bound_toy"] = "grpo"  # LLM RL cells, or the toy KL-bound study
    defaults: dict[str, Any] = Field(default_factory=dict)  # every cell starts from this config
    axes: dict[str, Axis] = Field(default_factory=dict)  # ordered: id fragments follow this order
    exclude: list[dict[str, Any]] = Field(default_factory=list)  # axis->label combos to drop
    seed_axis: str = "seed"  # which axis aggregates average over (mean ± sd)
    baseline: dict[str, Any] | None = None  # axis -> label of the row every other row is compared to (stats)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be letters, digits, '_' or '-' (it names a folder)")
        return v


@dataclass(frozen=True)
class Cell:
    id: str  # readable, deterministic, filesystem-safe, e.g. r16-kl0.05-s1
    axes: dict[str, str]  # axis name -> label of the value this cell takes
    config: Any  # the fully resolved config (CellConfig, or ToyCellConfig for toy studies)
    hash: str  # short hash of the resolved config: change a setting, the cell reruns
    aliases: tuple[str, ...] = field(default=())  # ids of identical cells merged into this one

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


def config_hash(cfg: BaseModel) -> str:
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _set_path(d: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = d
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            raise StudyError(f"axis sets `{path}`, but `{k}` is not a config section")
        node = node[k]
    if keys[-1] not in node:
        allowed = ", ".join(sorted(node))
        raise StudyError(f"axis sets unknown field `{path}`; allowed here: {allowed}")
    node[keys[-1]] = value


def _format_validation(err: ValidationError, where: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  {where}{loc}: {msg}")
    return "\n".join(lines)


def parse_study(raw: dict[str, Any], source: str = "<study>") -> Study:
    try:
        study = Study.model_validate(raw)
    except ValidationError as err:
        raise StudyError(f"invalid study {source}:\n{_format_validation(err, '')}") from None
    for name, ax in study.axes.items():
        if not _NAME.match(name):
            raise StudyError(f"invalid study {source}: axis name {name!r} must be letters/digits/_/-")
    for i, rule in enumerate(study.exclude):
        for ax, lab in rule.items():
            if ax not in study.axes:
                raise StudyError(
                    f"invalid study {source}: exclude[{i}] names unknown axis {ax!r}; "
                    f"allowed: {', '.join(study.axes)}"
                )
            labels = [label_of(v) for v in study.axes[ax].values]
            if str(lab) not in labels:
                raise StudyError(
                    f"invalid study {source}: exclude[{i}].{ax}={lab!r} is not a value of that axis; "
                    f"allowed: {', '.join(labels)}"
                )
    for ax, lab in (study.baseline or {}).items():
        if ax not in study.axes or ax == study.seed_axis:
            allowed = ", ".join(a for a in study.axes if a != study.seed_axis)
            raise StudyError(f"invalid study {source}: baseline names axis {ax!r}; allowed: {allowed}")
        labels = [label_of(v) for v in study.axes[ax].values]
        if label_of(lab) not in labels:
            raise StudyError(f"invalid study {source}: baseline.{ax}={lab!r} is not a value of that axis; "
                             f"allowed: {', '.join(labels)}")
    return study


def load_study(path: str | Path) -> Study:
    path = Path(path)
    if not path.exists():
        raise StudyError(f"study file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise StudyError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study must be a mapping with name/defaults/axes")
    study = parse_study(raw, str(path))
    expand(study, source=str(path))  # validates every resolved cell now, before anything runs
    return study


def expand(study: Study, source: str = "<study>") -> list[Cell]:
    """All cells of the matrix, in axis order, excluded combos dropped, duplicates merged."""
    cls = KINDS[study.kind]()
    try:
        base = cls.model_validate(study.defaults).model_dump(mode="json")
    except ValidationError as err:
        raise StudyError(f"invalid study {source}:\n{_format_validation(err, 'defaults.')}") from None
    combos: list[list[tuple[str, Any]]] = [[]]
    for name, ax in study.axes.items():
        combos = [c + [(name, v)] for c in combos for v in ax.values]
    cells: dict[str, Cell] = {}
    by_hash: dict[str, str] = {}
    for combo in combos:
        labels = {name: label_of(v) for name, v in combo}
        if any(all(labels[a] == str(lab) for a, lab in rule.items()) for rule in study.exclude):
            continue
        raw = json.loads(json.dumps(base))
        for name, v in combo:
            updates = v.set.items() if isinstance(v, Bundle) else [(study.axes[name].field, v)]
            for path, val in updates:
                _set_path(raw, path, val)
        try:
            cfg = cls.model_validate(raw)
        except ValidationError as err:
            raise StudyError(
                f"invalid study {source}: cell {labels} resolves to a bad config:\n"
                f"{_format_validation(err, 'defaults.')}"
            ) from None
        cid = "-".join(_SAFE.sub("_", f"{study.axes[n].prefix}{labels[n]}").strip("_.") for n, _ in combo) or "cell"
        h = config_hash(cfg)
        if h in by_hash:  # identical resolved config: keep the first id, remember the alias
            first = cells[by_hash[h]]
            cells[first.id] = Cell(first.id, first.axes, first.config, h, first.aliases + (cid,))
            continue
        if cid in cells:
            raise StudyError(f"invalid study {source}: two cells share the id {cid!r}; use distinct labels")
        by_hash[h] = cid
        cells[cid] = Cell(cid, labels, cfg, h)
    if not cells:
        raise StudyError(f"invalid study {source}: every cell is excluded")
    return list(cells.values())


def get_cell(study: Study, cell_id: str) -> Cell:
    cells = expand(study)
    for c in cells:
        if c.id == cell_id or cell_id in c.aliases:
            return c
    raise StudyError(f"no cell {cell_id!r} in study {study.name}; cells: {', '.join(c.id for c in cells)}")


def base_cells(study: Study) -> list[Cell]:
    """The `base` pseudo-cells: the untrained model (the lr = 0 anchor), one per distinct model."""
    if study.kind != "grpo":
        return []  # toy studies have no language model to anchor
    cells = expand(study)
    models = list(dict.fromkeys(c.config.model for c in cells))
    out = []
    for m in models:
        first = next(c for c in cells if c.config.model == m)
        short = _SAFE.sub("_", m.rstrip("/").split("/")[-1].split(":")[-1])
        cid = "base" if len(models) == 1 else f"base-{short}"
        out.append(Cell(cid, {"model": m}, first.config, config_hash(first.config)))
    return out


def base_of(study: Study, cell: Cell) -> Cell:
    return next(b for b in base_cells(study) if b.config.model == cell.config.model)


def find_cell(study: Study, cell_id: str) -> Cell:
    """A matrix cell or a base pseudo-cell by id."""
    for b in base_cells(study):
        if b.id == cell_id:
            return b
    return get_cell(study, cell_id)
