"""PEFT methods, initialisations and sparse masks as a registry (issue 5).

- `names`: the plain tuples METHODS / INITS / MASKS (what `lorarl.language.config` validates against).
- `registry`: the `Method` spec and `@register`; `catalog`: `get_method`, `check_config` (rejects
  fields that do not apply), `describe` over every registered method.
- `methods`: one class per method (peft classes/optimisers wherever peft has them).
- `ops`: what builders do to a model (LoRA inits on peft layers, masks, masked AdamW, AdaLoRA callback);
- `inits`, `masks`, `svd_cache`: the math of the init study and the off-principal masks; SVDs cached
  per (model, module) under results/svd_cache/<model-key>/.
- `build`: `build_adapter(model, cell_config) -> AdaptedPolicy` (model, optimizer, callbacks,
  fingerprint, save); `fingerprint`: observe a model and fail loudly on a mismatch.

Importing this package is light (no torch): heavy names are loaded on first use.
"""

from lorarl.adapters.names import INITS, MASKS, METHODS
from lorarl.adapters.catalog import check_config, describe, get_method
from lorarl.adapters.registry import AdapterSpecError

_LAZY = {
    "build_adapter": "lorarl.adapters.build",
    "AdaptedPolicy": "lorarl.adapters.build",
    "BuildContext": "lorarl.adapters.ops",
    "AdapterMismatch": "lorarl.adapters.fingerprint",
    "observe": "lorarl.adapters.fingerprint",
    "SVDCache": "lorarl.adapters.svd_cache",
}

__all__ = ["INITS", "MASKS", "METHODS", "AdapterSpecError", "check_config", "describe", "get_method", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lorarl.adapters' has no attribute {name!r}")
