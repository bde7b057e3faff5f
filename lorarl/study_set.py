"""`--config set=...`: a study's defaults overridden for one workflow run, its matrix as written.

    snakemake all --config studies='["experiments/demo_adaptive.yaml"]' results=results-quick \\
        set='{"model": "local:tiny-test", "train.steps": 4, "eval.eval_every": 2}'

How a user shrinks a shipped study (a smoke run, CI) without copying it: each key is a dotted field of the
study's ``defaults`` (a cell config field: ``train.steps``, ``task.n_eval``, ``model``), its value replaces the
file's. The axes, ``exclude``, ``search:`` and ``hypotheses:`` stay as the file has them: a key that an axis
sets is refused (the cells, their ids and the adaptive blocks are the file's), and so is one that is not a cell
config field. Rungs derived from ``eval.eval_every`` follow the new cadence.

The overridden study is validated like any study file (a bad key or value: exit 2, naming ``set.<key>`` or the
field, before anything is written), then written to ``results/<study>/study_set.yaml`` (:func:`effective_file`),
the study file every job of that run is handed (their cells' signatures are the overridden ones: to Snakemake
it is another study, so give it its own ``results:``). ``lorarl status`` / ``lorarl cells`` read that file.
Without ``set`` (or with ``{}``) the study file itself is used, untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lorarl import paths
from lorarl.language import yamlpos
from lorarl.io import atomic_write_text
from lorarl.language.matrix import StudyError

__all__ = ["effective_file", "apply_set"]

HEADER = "# {source} with `--config set={set}` (written by the workflow: edit {source}, not this file)\n"


def _axis_fields(raw: dict) -> dict[str, str]:
    """dotted field -> the axis that sets it, read from the parsed study."""
    from lorarl.language.study import parse_study

    study = parse_study(raw)
    return {p: name for name, ax in study.axes.items() for sets in ax.writes() for p, _ in sets}


def _typed(value: Any) -> Any:
    """A value as YAML reads it: Snakemake hands `--config set='{...}'` over with every scalar as text ("4")."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def apply_set(raw: dict, overrides: Any, source: str) -> dict:
    """The study mapping ``raw`` with ``overrides`` written into its ``defaults`` (a new mapping; ``raw`` unchanged).
    Raises StudyError naming ``set.<key>`` and what is allowed."""
    import copy

    from lorarl.language.config import CellConfig

    if not isinstance(overrides, dict):
        raise StudyError(f"config set: {overrides!r}; allowed: a mapping of study default fields to values, "
                         f"e.g. set='{{\"train.steps\": 4}}'")
    out = copy.deepcopy(raw)
    defaults = out.setdefault("defaults", {})
    if not isinstance(defaults, dict):
        raise StudyError(f"invalid study {source}: defaults must be a mapping")
    axes = _axis_fields(raw)
    for key, value in overrides.items():
        parts = str(key).split(".")
        if not isinstance(key, str) or not all(parts):
            raise StudyError(f"config set.{key}: allowed: a dotted cell config field, e.g. train.steps")
        writer = next((a for p, a in axes.items() if p == key or p.startswith(key + ".") or key.startswith(p + ".")),
                      None)
        if writer is not None:
            raise StudyError(f"config set.{key}: the axis {writer!r} of {source} sets it; allowed: fields no axis "
                             f"sets (set keeps the study's matrix as written)")
        model: Any = CellConfig
        for i, part in enumerate(parts):  # a field of the cell config (its sub-configs are pydantic models)
            fields = getattr(model, "model_fields", None)
            if fields is None:
                break
            if part not in fields:
                where = ".".join(parts[:i]) or "the cell config"
                raise StudyError(f"config set.{key}: {part!r} is not a field of {where}; allowed: "
                                 f"{', '.join(fields)}")
            model = fields[part].annotation
        node = defaults
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise StudyError(f"config set.{key}: {source} gives {part!r} a value that is not a mapping")
        node[parts[-1]] = _typed(value)
    return out


def effective_file(path: str | Path, overrides: Any, results: str | Path) -> Path:
    """The study file a workflow run hands its jobs: ``path`` itself without overrides, else the overridden study,
    validated, then written (only when its text changed) to ``results/<study>/study_set.yaml``."""
    from lorarl.language.adaptive.blocks import check_blocks
    from lorarl.language.preflight import check_references
    from lorarl.language.study import cell_table, parse_study

    if overrides in (None, {}, ""):
        return Path(path)
    path = Path(path)
    if not path.exists():
        raise StudyError(f"no such study file: {path}; allowed: a path to an existing study YAML")
    text = path.read_text()
    raw = yamlpos.load(text, str(path))
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study must be a mapping with name/defaults/axes")
    source = f"{path} with --config set"
    new = apply_set(raw, overrides, str(path))
    study = parse_study(new, source)  # validated before anything is written: the field is named
    table = cell_table(study)
    check_references(study, table.cells, source)
    check_blocks(study, table, source)
    out = paths.path("study_set", results=results, study=study.name)
    body = HEADER.format(source=path, set=yaml.safe_dump(overrides, default_flow_style=True, width=10**6).strip())
    body += yaml.safe_dump(new, sort_keys=False)
    if not out.exists() or out.read_text() != body:  # unchanged: its mtime stays
        atomic_write_text(out, body)
    return out
