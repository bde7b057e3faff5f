"""A study = defaults + ordered axes → a table of cells (id, resolved config, signature).

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

`search:` and `hypotheses:` (docs/adaptive.md) are study-level blocks: validated here (lorarl.language.adaptive.blocks),
never part of a cell's config or signature.

A bundle value (`{label, set}`) sets several fields at once. A field may be written by one axis only.
A field an axis sets that does not apply to the cell's method (``adapter.rank`` on ``full``) is
dropped for that cell (the axis leaves the cell's id, its label becomes ``n/a``); cells whose resolved
configs are identical merge (the first id wins, the others stay valid aliases).

How to use it (every lookup is a dictionary access; the table is built once per study per process):

    from lorarl.language.study import cell_table, load_study
    study = load_study("experiments/demo.yaml")   # validated (cached per file in this process)
    study = load_study_to_run(path)                # + its hub models/datasets cached or reachable (lorarl.language.hubcheck)
    study, cannot = load_study_to_list(path)       # listing only: + what of the hub this machine cannot get now
    table = cell_table(study)                      # the same object on every call for this study
    table.cells                                    # matrix cells in axis order (`Cell`)
    table.bases                                    # base pseudo-cells: the untrained model(s)
    table.cell("r8-kl0.05-s1")                     # a matrix cell, an alias, or a base pseudo-cell
    table.is_base("base"), table.ids, table.base_ids, table.notes (merges, for `lorarl cells`)
    table.eval_signature(cell_id, benchmark, step) # rerun trigger of one evaluation (memoised)

A cell's config is resolved before it is signed: the adapter method's registry defaults
(lorarl.adapters) are filled in, so cell.json, MLflow params and `Cell.hash` show what trains.
`Cell.hash` is the training signature (lorarl.language.signature).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from lorarl.language import yamlpos
from lorarl.language.adaptive.blocks import HypothesisSpec, SearchSpec, check_blocks
from lorarl.language.config import one_of
from lorarl.language.kinds import KINDS
from lorarl.language.matrix import (Axis, Bundle, Cell, CellTable, StudyError, build_table, flatten, format_validation,
                           label_of)
from lorarl.language.preflight import check_references
from lorarl.language.reserved import check_axis_name
from lorarl.strict import Strict

__all__ = ["KINDS", "Axis", "Bundle", "Cell", "CellTable", "Study", "StudyError", "base_cells", "cell_table",
           "find_cell", "flatten", "label_of", "load_study", "load_study_to_list", "load_study_to_run", "parse_study",
           "study_cells"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class Study(Strict):
    name: str  # MLflow experiment name and results/<name>/ folder
    kind: str = "grpo"  # a registered study kind (lorarl.language.kinds): LLM RL cells, or the toy KL-bound study
    defaults: dict[str, Any] = Field(default_factory=dict)  # every cell starts from this config
    axes: dict[str, Axis] = Field(default_factory=dict)  # ordered: id fragments follow this order
    exclude: list[dict[str, Any]] = Field(default_factory=list)  # axis->label combos to drop
    seed_axis: str = "seed"  # which axis aggregates average over (mean ± sd)
    baseline: dict[str, Any] | None = None  # axis -> label of the row every other row is compared to (stats)
    search: SearchSpec | None = None  # successive halving over rungs (docs/adaptive.md): study-level, in no cell's signature
    hypotheses: dict[str, HypothesisSpec] = Field(default_factory=dict)  # named comparisons tested seed by seed (docs/adaptive.md)
    _table: Any = PrivateAttr(default=None)  # the CellTable, built once (cell_table)
    _source: str = PrivateAttr(default="<study>")  # the file, named in errors
    _hub_checked: bool = PrivateAttr(default=False)  # its hub references were found (lorarl.language.hubcheck), once

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        return one_of(v, list(KINDS), "study kind")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be letters, digits, '_' or '-' (it names a folder)")
        return v


# ---------------------------------------------------------------------------------------------
# Parsing and loading
# ---------------------------------------------------------------------------------------------


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _check_writers(study: Study, source: str) -> None:
    """A field may be written by one axis only (else the later axis would silently win)."""
    seen: list[tuple[str, str]] = []  # (path, axis)
    for name, ax in study.axes.items():
        paths = list(dict.fromkeys(p for sets in ax.writes() for p, _ in sets))
        for p in paths:
            for q, other in seen:
                if other != name and _overlap(p, q):
                    raise StudyError(f"invalid study {source}: axes {other!r} and {name!r} both set `{q}`"
                                     f"{'' if p == q else f' / `{p}`'}; one field can be set by one axis only "
                                     f"(use one axis of bundles instead)")
        seen += [(p, name) for p in paths]


def parse_study(raw: dict[str, Any], source: str = "<study>") -> Study:
    try:
        study = Study.model_validate(raw)
    except ValidationError as err:
        raise StudyError(f"invalid study {source}:\n{format_validation(err, '', Study)}") from None
    for name, ax in study.axes.items():
        if not _NAME.match(name):
            raise StudyError(f"invalid study {source}: axis name {name!r} must be letters/digits/_/-")
        why = check_axis_name(name)  # lorarl.language.reserved: the report's own columns
        if why:
            raise StudyError(f"invalid study {source}: axes.{name}: {why}")
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
    _check_writers(study, source)
    study._source = source
    return study


_LOADED: dict[tuple[str, str], Study] = {}  # (path, file text) -> Study: one table per file content


def load_study(path: str | Path) -> Study:
    """Parse, validate and build the cell table of a study file (cached per file content in this process:
    mtimes are too coarse to tell two quick edits apart)."""
    path = Path(path)
    if not path.exists():
        raise StudyError(f"no such study file: {path}; allowed: a path to an existing study YAML "
                         f"(e.g. experiments/demo.yaml)")
    text = path.read_text()
    key = (str(path.resolve()), text)
    if key in _LOADED:
        return _LOADED[key]
    raw = yamlpos.load(text, str(path))  # duplicate keys refused; YAML errors name the line
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study must be a mapping with name/defaults/axes; allowed top-level keys: "
                         f"{', '.join(Study.model_fields)}")
    try:
        study = parse_study(raw, str(path))
        table = cell_table(study)  # validates every resolved cell now, before anything runs
        check_references(study, table.cells, str(path))  # local recipes, model/teacher/data paths exist
        check_blocks(study, table, str(path))  # search: / hypotheses: against the axes and cells (lorarl.adaptive)
    except StudyError as err:
        raise StudyError(yamlpos.annotate(str(err), text)) from None  # + (line N) of the field named
    _LOADED[key] = study
    return study


def load_study_to_run(path: str | Path, hub_check: Any = True) -> Study:
    """`load_study`, then (once per study in this process) every hub model and dataset its cells name must be in
    the local Hugging Face cache or answer on the hub (lorarl.language.hubcheck), unless `hub_check` (the profile's
    setting) or $LORARL_HUB_CHECK turns that off: what runs a study (`lorarl run/doctor`, Snakemake) loads it
    this way, so a missing model is refused before anything runs or is written."""
    from lorarl.language import hubcheck

    study = load_study(path)
    if study._hub_checked or not hubcheck.enabled(hub_check):
        return study
    table = cell_table(study)
    try:
        hubcheck.check_study(study, [*table.cells, *table.bases], str(path))
    except StudyError as err:
        raise StudyError(yamlpos.annotate(str(err), Path(path).read_text())) from None
    study._hub_checked = True
    return study


def load_study_to_list(path: str | Path) -> tuple[Study, list[str]]:
    """`load_study` for what only lists a study (`lorarl cells`): the study and a line per hub model or dataset this
    machine cannot get now (not cached; the hub offline or unreachable, told by one short probe: lorarl.language.hubcheck),
    each with its line in the file. A reference the hub says does not exist refuses the study, as running it would;
    `$LORARL_HUB_CHECK=0` skips the check."""
    from lorarl.language import hubcheck

    probe = hubcheck.early_probe()  # asks the hub while the study loads
    study = load_study(path)
    if not hubcheck.enabled():
        return study, []
    table = cell_table(study)
    text = Path(path).read_text()
    try:
        lines = hubcheck.listing(study, [*table.cells, *table.bases], str(path), probe)
    except StudyError as err:
        raise StudyError(yamlpos.annotate(str(err), text)) from None
    return study, yamlpos.annotate("\n".join(lines), text).splitlines()  # + (line N): the YAML read once


def cell_table(study: Study) -> "CellTable":
    """The study's cell table, built on first use and kept on the study object."""
    if study._table is None:
        study._table = build_table(study, study._source)
        if study.hypotheses:  # seeds a hypothesis may add: found by id, never in `cells` (lorarl.language.adaptive.seeds)
            import functools

            from lorarl.language.adaptive.seeds import added_cells, added_values

            study._table.extra_source = functools.partial(added_cells, study)
            try:
                more = added_values(study)
            except ValueError:  # refused by check_blocks, naming the field
                more = []
            if more:
                study._table.notes.append(f"hypotheses may add seeds {more[0]}..{more[-1]} to their two settings at "
                                          f"run time: ordinary cells, found by id (docs/adaptive.md)")
    return study._table


# Shorthands kept for callers that hold a Study (each a dictionary access after the first build).
def find_cell(study: Study, cell_id: str) -> Cell:
    """A matrix cell (or an alias of one) or a base pseudo-cell by id."""
    return cell_table(study).cell(cell_id)


def base_cells(study: Study) -> list[Cell]:
    """The `base` pseudo-cells: the untrained model (the lr = 0 anchor), one per distinct model."""
    return cell_table(study).bases


def study_cells(study: Study) -> list[Cell]:
    """The matrix cells in axis order, excluded combos dropped, identical cells merged."""
    return cell_table(study).cells


def every_cell(study: Study) -> list[Cell]:
    """The matrix cells, then the seeds a hypothesis may add at run time (lorarl.language.adaptive.seeds): every cell
    whose files a reader may meet, so that a lookup by id never misses an added seed."""
    table = cell_table(study)
    return list(table.cells) + list(table.extra_cells())
