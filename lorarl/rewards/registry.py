"""Reward regimes by name: imports every module of this package (each regime registers itself with
``lorarl.rewards.register_regime``) and builds a cell's regime from its ``reward:`` config."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Callable

from lorarl.rewards import REGIMES, Regime


def load_all() -> dict[str, Callable[..., Regime]]:
    """Import every module of lorarl/rewards/ (registration happens at import); name -> builder."""
    for mod in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if mod.name != "registry":
            importlib.import_module(f"lorarl.rewards.{mod.name}")
    return REGIMES


def regime_names() -> tuple[str, ...]:
    """The allowed values of ``reward.regime``, sorted (import order must not change messages)."""
    return tuple(sorted(load_all()))


def build_regime(cfg: Any, tokenizer: Any, *, results_dir: str | Path = "results",
                 device: str = "cpu", temperature: float = 1.0) -> Regime:
    """The cell's regime from its ``reward:`` config (teacher/PRM models are loaded by its builder).
    ``cfg`` is a lorarl.config.RewardConfig, not imported even for the annotation: the config reads
    ``regime_names`` from here, and the import graph must stay one way."""
    regimes = load_all()
    if cfg.regime not in regimes:
        raise ValueError(f"unknown reward.regime {cfg.regime!r}; allowed: {', '.join(regime_names())}")
    return regimes[cfg.regime](cfg, tokenizer, results_dir=results_dir, device=device, temperature=temperature)
