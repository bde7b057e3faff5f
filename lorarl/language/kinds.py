"""Study kinds by name (a study's `kind:`): what a cell is, how its defaults resolve, and how the
study runs. `lorarl.language.matrix` (the cell table), `lorarl cells/aggregate/report`, `lorarl doctor` and
workflow/rules/common.smk consult this registry; none of them tests a kind's name.

A kind either runs per-cell stages (`cell_stages`: one Snakemake job per cell and stage) or one
`batch_stage` job for every cell of the study. Its `aggregate` names the function
`fn(study, results_dir)` that `lorarl aggregate` runs, as "module:function" (imported when called,
so this module stays light and imports no stage).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel




def _grpo_config() -> type[BaseModel]:
    from lorarl.language.config import CellConfig

    return CellConfig


def _toy_config() -> type[BaseModel]:
    from lorarl.language.toy import ToyCellConfig

    return ToyCellConfig


def _no_resolve(cfg: BaseModel, cache: dict) -> BaseModel:
    return cfg


def _plain_base(cls: type[BaseModel], defaults: dict, axis_paths: set[str]) -> dict:
    return cls.model_validate(defaults).model_dump(mode="json")


def _grpo_base(cls: type[BaseModel], defaults: dict, axis_paths: set[str]) -> dict:
    """The defaults validated (a ``reward:`` block whose regime an axis sets serves several regimes: each takes its
    own fields), dumped with every regime's reward fields (lorarl.rewards.registry.flat_block)."""
    from lorarl.rewards.registry import flat_block, shared_block

    raw = dict(defaults)
    if "reward.regime" in axis_paths and "reward" in raw:
        raw["reward"] = shared_block(raw["reward"])
    cfg = cls.model_validate(raw)
    return {**cfg.model_dump(mode="json"), "reward": flat_block(cfg.reward)}


def _grpo_updates(cfg: BaseModel) -> tuple[int, int]:
    return cfg.train.updates_per_step, cfg.train.optimizer_updates


def _one_unit(cfg: BaseModel) -> tuple[int, int]:
    return 1, 1


def _nothing_inapplicable(raw: dict, set_by: dict[str, str]) -> tuple[str, list[str]]:
    return "", []


def _grpo_resolve(cfg: BaseModel, cache: dict) -> BaseModel:
    """Fill the adapter method's registry defaults (rank, alpha, init, target_modules, ...)."""
    from lorarl.adapters.catalog import FIELDS, check_config

    values = cfg.adapter.model_dump(mode="json")
    key = json.dumps(values, sort_keys=True)
    if key not in cache:
        applied = check_config(values)
        cache[key] = type(cfg.adapter).model_validate({**{f: None for f in FIELDS}, **applied})
    return cfg.model_copy(update={"adapter": cache[key].model_copy()})


def _grpo_inapplicable(raw: dict, set_by: dict[str, str]) -> tuple[str, list[str]]:
    """Null the adapter fields an axis set that the cell's method does not use; returns (method,
    dropped dotted paths). A field the defaults set stays an error (lorarl.adapters names it). The table's
    ``reward:`` block holds every regime's fields (:func:`_grpo_base`): the other regimes' are set aside for the cell
    (lorarl.rewards.registry.shared_block: its signature keeps them, its regime never sees them), unless an axis
    set one for a regime no axis changes (an error naming the regime's fields)."""
    from lorarl.adapters.catalog import FIELDS, AdapterSpecError, get_method

    from lorarl.rewards.registry import shared_block

    sets = set() if "reward.regime" in set_by else {p.split(".", 1)[1] for p in set_by if p.startswith("reward.")}
    raw["reward"] = shared_block(raw.get("reward", {}), strict=sets)
    ad = raw.get("adapter")
    if not isinstance(ad, dict):
        return "", []
    try:
        method = get_method(ad.get("method", "lora"))
    except AdapterSpecError:
        return "", []  # validation reports the unknown method
    applies = method.applicable(ad)
    dropped = []
    for f in FIELDS:
        path = f"adapter.{f}"
        if ad.get(f) is not None and f not in applies and path in set_by:
            ad[f] = None
            dropped.append(path)
    return method.name, dropped


@dataclass(frozen=True)
class Kind:
    name: str  # the study's `kind:` value
    config: Callable[[], type[BaseModel]]  # the cell config class (imported lazily)
    resolve: Callable[[BaseModel, dict], BaseModel] = _no_resolve  # registry defaults filled before hashing
    inapplicable: Callable[[dict, dict], tuple[str, list[str]]] = _nothing_inapplicable  # fields dropped
    base: Callable[[type[BaseModel], dict, set[str]], dict] = _plain_base  # (cls, defaults, paths axes set) -> every cell's starting dump
    has_base: bool = False  # whether the study has base pseudo-cells (an untrained model to evaluate)
    cell_stages: tuple[str, ...] = ()  # stages run per cell (Snakemake rules train/evaluate/diagnose)
    batch_stage: str | None = None  # else: the one `lorarl launch` stage that runs every cell of the study
    aggregate: str = ""  # "module:function(study, results_dir)" that `lorarl aggregate` runs
    report: bool = False  # whether `lorarl report` (the papers' figures and tables) applies
    updates: Callable[[BaseModel], tuple[int, int]] = _one_unit  # a cell's (updates per step, updates in all): the progress unit of status/watch/ETA


KINDS: dict[str, Kind] = {}  # name -> Kind, in registration order


def register_kind(kind: Kind) -> Kind:
    if kind.name in KINDS:
        raise ValueError(f"study kind {kind.name!r} registered twice")
    if bool(kind.cell_stages) == bool(kind.batch_stage):
        raise ValueError(f"study kind {kind.name!r}: give cell_stages or a batch_stage (exactly one)")
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> Kind:
    if name not in KINDS:
        raise ValueError(f"unknown study kind {name!r}; allowed: {', '.join(KINDS)}")
    return KINDS[name]


def entry(path: str) -> Callable[..., Any]:
    """The function a "module:function" string names (imported now)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


register_kind(Kind("grpo", _grpo_config, _grpo_resolve, _grpo_inapplicable, _grpo_base, has_base=True,
                   cell_stages=("train", "evaluate", "diagnose"), aggregate="lorarl.report.aggregate:aggregate",
                   report=True, updates=_grpo_updates))
register_kind(Kind("kl_bound_toy", _toy_config, batch_stage="toy",  # the toy has no language model to anchor
                   aggregate="lorarl.toy.cells:aggregate_toy"))
