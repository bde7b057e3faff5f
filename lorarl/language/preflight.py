"""Files and names a study refers to, checked when it is loaded (before anything runs or is written).

* `model` / `reward.teacher` / `reward.prm_model`: `local:<recipe>` must name a recipe of lorarl.models; a
  filesystem path (starting with `/`, `./`, `../` or `~`) must exist. Anything else is a hub id: lorarl.language.hubcheck
  finds it in the local Hugging Face cache or on the hub before a study runs.
* `task.path` (or each `task.sources[i].path`) of a `dataset` task: a local file path (path-like, or ending in .jsonl/.json/.parquet/.csv)
  must exist. URLs (`hf://...`) are left to the loader.
Paths that exist only on the compute nodes (not where Snakemake runs): set LORARL_SKIP_PATH_CHECKS=1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lorarl.language.matrix import Bundle, StudyError

SKIP_ENV = "LORARL_SKIP_PATH_CHECKS"
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def _path_like(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~"))


def where(study: Any, field: str, value: Any) -> str:
    """The place in the study that sets `field` to `value`: an axis value, else the defaults."""
    for name, ax in study.axes.items():
        for i, v in enumerate(ax.values):
            sets = v.set if isinstance(v, Bundle) else {ax.field: v}
            for path, val in sets.items():
                if path == field and val == value:
                    return f"axes.{name}.values[{i}]"
    return f"defaults.{field}"


def _problem(field: str, value: str) -> str | None:
    from lorarl.models import RECIPES, recipe_name

    name = recipe_name(value)
    if name is not None:
        if name not in RECIPES:
            return f"unknown local model recipe {name!r}; allowed: " + ", ".join(f"local:{r}" for r in RECIPES)
        return None
    if "://" in value:  # a URL (hf://, s3://, https://): the loader checks it
        return None
    if field == "task.path" or field.startswith("task.sources["):
        if (_path_like(value) or value.endswith(_DATA_SUFFIXES)) and not Path(value).expanduser().exists():
            return f"no such file {value!r}; allowed: an existing local file or a hub dataset id"
        return None
    if _path_like(value) and not Path(value).expanduser().exists():
        return (f"no such directory {value!r}; allowed: an existing model directory, a hub id (org/name) or "
                f"local:<recipe>")
    return None


def check_references(study: Any, cells: list[Any], source: str) -> None:
    """Raise StudyError naming the first missing file or unknown recipe (place + what is allowed)."""
    seen: set[tuple[str, str]] = set()
    for cell in cells:
        cfg = cell.config
        refs = [("model", getattr(cfg, "model", None))]
        reward = getattr(cfg, "reward", None)
        refs.append(("reward.teacher", getattr(reward, "teacher", None)))
        refs.append(("reward.prm_model", getattr(reward, "prm_model", None)))
        task = getattr(cfg, "task", None)
        if getattr(task, "name", None) == "dataset":
            refs.append(("task.path", getattr(task, "path", None)))
            refs += [(f"task.sources[{i}].path", s.path) for i, s in enumerate(getattr(task, "sources", None) or ())]
        for field, value in refs:
            if not isinstance(value, str) or (field, value) in seen:
                continue
            seen.add((field, value))
            if os.environ.get(SKIP_ENV) and recipe_name_of(value) is None:
                continue
            why = _problem(field, value)
            if why:
                raise StudyError(f"invalid study {source}: {where(study, field, value)}: {why}")


def recipe_name_of(value: str) -> str | None:
    from lorarl.models import recipe_name

    return recipe_name(value)
