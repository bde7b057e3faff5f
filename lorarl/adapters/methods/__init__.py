"""Every `adapter.method`, one module per method, each registering itself with
`lorarl.adapters.registry.register` (`common` holds what they share). peft's own classes and optimisers
are used wherever peft has them; what peft lacks (the init-study inits, the residual bookkeeping, sparse
masks, AdaLoRA's schedule inside a TRL trainer) lives in `lorarl.adapters.ops`.

Importing this package imports every method module (in `names.METHODS` order, so the registry and its
messages list them in that order). Import-light: torch/peft/transformers are imported inside the
methods, so `lorarl.language.config` can load the registry to validate cells. Adding a method: a module here
named after it, and its name in `lorarl.adapters.names.METHODS`.
"""

from __future__ import annotations

import importlib

from lorarl.adapters.names import METHODS

for _name in METHODS:
    importlib.import_module(f"lorarl.adapters.methods.{_name}")
