"""Bad studies that are too large to expand, for lorarl.badstudies ("too large" category).

A study whose axes multiply past the cell cap (lorarl.language.matrix.max_cells: $LORARL_MAX_CELLS, default
100,000) and YAML whose aliases expand past lorarl.language.yamlpos.MAX_ALIAS_NODES (alias bombs) or refer to
themselves must be refused before anything expands: in well under a second, in little memory, exit
status 2, the message naming each axis's size and the cap, or the alias.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml


def _axes(valid: dict[str, Any], axes: dict[str, tuple[str, list[Any]]]) -> str:
    d = copy.deepcopy(valid)
    d["axes"] = {n: {"field": f, "prefix": n[0], "values": v} for n, (f, v) in axes.items()}
    return yaml.safe_dump(d, sort_keys=False)


def _bomb(valid: dict[str, Any], levels: int, fan: int, where: str = "top") -> str:
    """A study with `levels` lists, each of `fan` aliases of the list before: fan**levels values."""
    lists = [f"[{', '.join(['1'] * fan)}]"] + [f"[{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels)]
    if where == "top":  # one line per list, under an unknown top-level key: it goes off before any schema check
        return yaml.safe_dump(valid, sort_keys=False) + "".join(f"l{i}: &l{i} {x}\n" for i, x in enumerate(lists))
    d = copy.deepcopy(valid)  # inside an axis's values
    d["axes"]["seed"]["values"] = "BOMB"
    return yaml.safe_dump(d, sort_keys=False).replace(
        "BOMB", "[" + ", ".join(f"&l{i} {x}" for i, x in enumerate(lists)) + "]", 1)


def too_large(valid: dict[str, Any], case: Any) -> list[Any]:
    ten = list(range(10))
    million = {"seed": ("seed", ten), "rank": ("adapter.rank", [r + 1 for r in ten]),
               "lr": ("train.lr", [1e-4 * (i + 1) for i in ten]), "beta": ("train.beta", [0.01 * i for i in ten]),
               "temp": ("train.temperature", [0.5 + 0.1 * i for i in ten]),
               "tok": ("eval.max_new_tokens", [8 + i for i in ten])}
    wide = {"seed": ("seed", list(range(100))), "lr": ("train.lr", [1e-6 * (i + 1) for i in range(100)]),
            "rank": ("adapter.rank", list(range(1, 101)))}
    return [case("too large", "axes multiply to a million cells", _axes(valid, million), "1,000,000 cells"),
            case("too large", "three axes of 100 values", _axes(valid, wide), "axes.seed (100)"),
            case("too large", "a billion cells", _axes(valid, {**million, "a": ("adapter.alpha", ten),
                                                                   "b": ("adapter.dropout", [0.0] * 10),
                                                                   "c": ("train.steps", [i + 1 for i in ten])}),
                 "1,000,000,000 cells"),
            case("too large", "three-line alias bomb", _bomb(valid, 3, 100), "alias"),
            case("too large", "nine-level alias bomb (billion laughs)", _bomb(valid, 9, 9), "alias bomb"),
            case("too large", "alias bomb in axis values", _bomb(valid, 4, 40, where="axis"), "alias"),
            case("too large", "recursive alias", yaml.safe_dump(valid, sort_keys=False).replace(
                "defaults:\n", "loop: &loop [1, *loop]\ndefaults:\n", 1), "recursive")]
