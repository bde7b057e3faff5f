"""Run by tests/test_job_imports.py in a fresh interpreter: the heavy modules a job of each stage has imported.

    python tests/support/stage_imports.py '<json spec>'

In this order, in one process (each phase adds to what the earlier ones imported): `lorarl aggregate` of
each study in spec["aggregate"]; `lorarl run <study> <cell> --stages <stage>` for each [stage, study, cell] of
spec["jobs"] (through run_stage, what every job runs), its modules taken at the stage's first real work
(lorarl.jobclock) and at its end; then, with spec["call_deferred"], every name lorarl.lazy_imports defers,
called. Prints one JSON line: {phase: [heavy modules loaded]} plus "deferred_calls" (each deferred name's
result, then the real function's) and "real_modules" (the type of sklearn.metrics etc. at the end).
"""

from __future__ import annotations

import importlib
import json
import sys

HEAVY = ("torch", "torch._dynamo", "transformers", "peft", "trl", "datasets", "mlflow", "pandas", "matplotlib",
         "scipy", "scipy.optimize", "scipy.stats", "sklearn")
CALLS = {  # a deferred name -> arguments it is called with
    "roc_curve": ([0, 1, 0, 1], [0.1, 0.9, 0.4, 0.8]),
    "f1_score": ([0, 1, 1], [0, 1, 0]),
    "matthews_corrcoef": ([0, 1, 1, 0], [0, 1, 0, 0]),
    "pearsonr": ([1.0, 2.0, 3.0], [1.0, 2.0, 4.0]),
    "spearmanr": ([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]),
    "linear_sum_assignment": ([[4, 1], [2, 0]],),
}


def loaded() -> list[str]:
    return [m for m in HEAVY if m in sys.modules]


def plain(x: object) -> object:
    """Results as JSON: arrays and tuples as lists, scipy's result objects as their fields."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, tuple):
        return [plain(v) for v in x]
    if hasattr(x, "statistic"):
        return plain(tuple(x))
    return x


def main() -> None:
    spec = json.loads(sys.argv[1])
    from lorarl import jobclock
    from lorarl.cli import main as lorarl

    out: dict[str, object] = {"start": loaded()}
    for study in spec.get("aggregate", []):
        assert lorarl(["aggregate", study, "--results", spec["results"]]) == 0
        out[f"aggregate {study}"] = loaded()
    first = jobclock.first_work

    def at_first_work(what: str) -> None:  # the modules when the stage's start-up ends
        out.setdefault(f"{stage} first {what}", loaded())
        first(what)

    for mod in [jobclock, *(m for n, m in list(sys.modules.items()) if n.startswith("lorarl."))]:
        if getattr(mod, "first_work", None) is first:  # already imported by name, or imported later
            mod.first_work = at_first_work
    for stage, study, cell in spec.get("jobs", []):
        assert lorarl(["run", study, cell, "--results", spec["results"], "--stages", stage]) == 0
        out[stage] = loaded()
    if not spec.get("call_deferred"):
        print(json.dumps(out))
        return
    from lorarl.lazy_imports import DEFERRED

    calls = {}
    for importer, targets in DEFERRED.items():
        module = importlib.import_module(importer)
        for target, names in targets.items():
            for name in names:
                deferred = plain(getattr(module, name)(*CALLS[name]))
                calls[f"{importer}.{name}"] = [deferred, plain(getattr(importlib.import_module(target), name)(*CALLS[name]))]
    out["deferred_calls"] = calls
    out["real_modules"] = {t: type(sys.modules[t]).__name__ for targets in DEFERRED.values() for t in targets}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
