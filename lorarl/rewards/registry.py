"""Reward regimes by name: imports every module of this package (each regime registers itself with
``lorarl.rewards.register_regime``), builds a cell's regime from its ``reward:`` config and answers for
the regime's facts (:class:`lorarl.rewards.RegimeSpec`: the models it loads, its required settings)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Callable

from lorarl.rewards import REGIMES, ExtraModel, Regime, RegimeSpec


def load_all() -> dict[str, RegimeSpec]:
    """Import every module of lorarl/rewards/ (registration happens at import); name -> spec."""
    for mod in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if mod.name != "registry":
            importlib.import_module(f"lorarl.rewards.{mod.name}")
    return REGIMES


def regime_names() -> tuple[str, ...]:
    """The allowed values of ``reward.regime``, sorted (import order must not change messages)."""
    return tuple(sorted(load_all()))


def spec_of(regime: str) -> RegimeSpec:
    """The registered spec of ``reward.regime`` (ValueError naming the allowed values otherwise)."""
    regimes = load_all()
    if regime not in regimes:
        raise ValueError(f"unknown reward.regime {regime!r}; allowed: {', '.join(regime_names())}")
    return regimes[regime]


def extra_models(cfg: Any) -> list[ExtraModel]:
    """The models the regime of ``cfg`` (a RewardConfig) loads beside the policy: a teacher, a PRM, none."""
    return spec_of(cfg.regime).extra_models(cfg)


def build_regime(cfg: Any, tokenizer: Any, *, resolve: Callable[[str], str] | None = None,
                 device: str = "cpu", temperature: float = 1.0) -> Regime:
    """The cell's regime from its ``reward:`` config (teacher/PRM models are loaded by its builder).
    ``cfg`` is a lorarl.spec.config.RewardConfig, not imported even for the annotation: the config reads
    ``regime_names`` from here, and the import graph must stay one way. ``resolve``: what a model name of
    the config loads from (``local:<recipe>`` -> its build folder: lorarl.models.resolve_model, handed in
    by the caller for the same reason); None: names load as written."""
    return spec_of(cfg.regime).build(cfg, tokenizer, resolve=resolve, device=device, temperature=temperature)
