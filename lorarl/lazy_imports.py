"""Imports that transformers makes as it loads, for features no lorarl job uses, deferred to those
features' first use.

Loading a model, or TRL's trainer, runs these optional imports of transformers 5.17 at module level:

- `transformers.generation.candidate_generator`: `if is_sklearn_available(): from sklearn.metrics import
  roc_curve`, for assisted decoding with `assistant_confidence_threshold` (the draft model's threshold is
  tuned on the ROC curve of its acceptances);
- six detection losses (`transformers.loss.loss_rt_detr` and others, loaded by `modeling_utils`' loss
  table): `if is_scipy_available(): from scipy.optimize import linear_sum_assignment`, for the Hungarian
  matching of DETR-style models;
- `transformers.data.metrics` (loaded by `Trainer`): scipy.stats' `pearsonr`, `spearmanr` and sklearn's
  `f1_score`, `matthews_corrcoef`, for the deprecated GLUE/XNLI metric helpers.

scikit-learn (which brings pandas), scipy.optimize and scipy.stats cost every job that loads a model 0.5 to
1 s of CPU, up to a quarter of an evaluation's start-up, on a 2-core machine (`bench/job_start.py`,
docs/benchmarks.md). Neither transformers nor torch has a switch for them (`is_sklearn_available` and
`is_scipy_available` are cached `find_spec` calls), and lorarl needs both packages installed (the toy
study's Optdigits and optimiser, the report's statistics).

`defer_optional_imports()` (where a job starts: `lorarl.pipeline.jobs.launch.run_stage`) adds a finder that acts
only while one of those transformers modules executes: it answers that module's imports with stand-in
modules whose names import the real functions on their first call. Any other use of a stand-in (another
module importing the same package while it stands) imports the real module there and then, so nobody gets
less than the real thing. The stand-ins leave `sys.modules` as soon as the module has loaded. Nothing is
patched: no library function or attribute is replaced (tests/test_job_imports.py calls the deferred names).
`LORARL_EAGER_IMPORTS=1` in a job's environment turns the deferral off (the baseline of bench/job_start.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import types
from typing import Any, Callable

EAGER_ENV = "LORARL_EAGER_IMPORTS"  # "1": no deferral, transformers imports as it always did (bench baseline)
_DETR = {"scipy.optimize": ("linear_sum_assignment",)}
DEFERRED: dict[str, dict[str, tuple[str, ...]]] = {  # transformers module -> {module it imports: names it takes}
    "transformers.generation.candidate_generator": {"sklearn.metrics": ("roc_curve",)},
    "transformers.data.metrics": {"scipy.stats": ("pearsonr", "spearmanr"),
                                  "sklearn.metrics": ("f1_score", "matthews_corrcoef")},
    **{f"transformers.loss.loss_{m}": _DETR
       for m in ("for_object_detection", "deformable_detr", "rt_detr", "rf_detr", "grounding_dino", "lw_detr")},
}


def _real(module: str) -> types.ModuleType:
    """The real module (a stand-in still in `sys.modules` is replaced by it)."""
    if isinstance(sys.modules.get(module), _StandIn):
        del sys.modules[module]
    return importlib.import_module(module)


def on_first_call(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported when first called."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_real(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{module}.{name}, imported on the first call (lorarl.lazy_imports)"
    return call


class _StandIn(types.ModuleType):
    """Holds the deferred names; any other attribute is the real module's (not `__path__` and the like,
    which the import system probes: a stand-in is no package)."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(_real(self.__name__), attr)


class _DeferringLoader(importlib.abc.Loader):
    """The importer's own loader; while it executes the module, the modules it imports are stand-ins."""

    def __init__(self, loader: Any, targets: dict[str, tuple[str, ...]]):
        self.loader, self.targets = loader, targets

    def __getattr__(self, attr: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self.loader, attr)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stand_ins = {}
        for target, names in self.targets.items():
            if target not in sys.modules:  # already imported: nothing to save
                stand_ins[target] = _StandIn(target, f"stand-in of {target} (lorarl.lazy_imports)")
                for name in names:
                    setattr(stand_ins[target], name, on_first_call(target, name))
        sys.modules.update(stand_ins)
        try:
            self.loader.exec_module(module)
        finally:
            for target, stand_in in stand_ins.items():
                if sys.modules.get(target) is stand_in:
                    del sys.modules[target]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a DEFERRED importer with the finders after it and wraps its loader; any other name: not ours."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in DEFERRED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _DeferringLoader(spec.loader, DEFERRED[name])
                return spec
        return None


def defer_optional_imports() -> None:
    """Install the finder, once per process ($LORARL_EAGER_IMPORTS=1: not at all)."""
    if os.environ.get(EAGER_ENV) != "1" and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
