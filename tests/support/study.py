"""The tiny study every test starts from: `tiny_study(name, **sections)` is the 2-seed study of the tiny model
(``local:tiny-test``, built by lorarl.models) with each ``defaults`` section given replaced whole (None: left
out), so a test's study says only how it differs. `write_study` puts it in a YAML file."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

TRAIN = {"steps": 3, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16, "lr": 1e-3}  # seconds a cell
DEFAULTS = {
    "model": "local:tiny-test",
    "task": {"name": "synthetic", "n_train": 64, "n_eval": 8},
    "adapter": {"rank": 2, "alpha": 4},
    "train": TRAIN,
    "eval": {"max_new_tokens": 16},
}
# The in-process cells (a saved tiny model, no Snakemake): a fixed draw (task seed 7) of small sums, dropout off.
IN_PROCESS = {"task": {"name": "synthetic", "seed": 7, "n_train": 12, "n_eval": 4, "max_value": 9},
              "adapter": {"method": "lora", "rank": 2, "alpha": 4, "dropout": 0.0}}
IN_PROCESS_TRAIN = {"prompts_per_step": 2, "generations": 2, "max_completion_length": 8, "lr": 1e-2}


def seeds(*values: int) -> dict:
    """The seed axis over ``values`` (cells s0, s1, ...)."""
    return {"seed": {"field": "seed", "prefix": "s", "values": list(values)}}


def tiny_study(name: str = "e2e", *, axes: dict | None = seeds(0, 1), **sections) -> dict:
    """The tiny study named ``name``: DEFAULTS with each of ``sections`` replacing its section (None removes it,
    a new name adds it), over ``axes`` (None: no axes, one cell)."""
    defaults = copy.deepcopy(DEFAULTS)
    for key, value in sections.items():
        if value is None:
            defaults.pop(key, None)
        else:
            defaults[key] = copy.deepcopy(value)
    doc = {"name": name, "defaults": defaults}
    return doc if axes is None else {**doc, "axes": copy.deepcopy(axes)}


def write_study(path: Path, doc: dict) -> Path:
    """``doc`` as the YAML study file ``path``, its keys in their order (the axes' order is the cells' order)."""
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
