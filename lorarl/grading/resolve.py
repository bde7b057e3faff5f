"""A benchmark's protocol with a study's overrides, and the field-level checks of `eval:`.

`lorarl.language.config` validates `eval:` through :func:`check_eval_config`, so this module sits below the
config: it reads the benchmark and protocol registries and never imports `lorarl.language.config` (not even
for annotations); config never closes an import circle through the evaluation plan
(`lorarl.language.evalplan.plan`, above the config, re-exports these names).
"""

from __future__ import annotations

from typing import Any

from lorarl.grading.benchmarks import BENCHMARKS, get_benchmark
from lorarl.grading.protocols import Protocol

SYNTHETIC = "synthetic"  # the CPU task's held-out split (rows come from the cell's task)


class EvalPlanError(ValueError):
    """An evaluation setting cannot be honoured; the message names the field and allowed values."""


def _allowed() -> str:
    return ", ".join(sorted(BENCHMARKS))


def resolve_protocol(default: Protocol, override: "Any" = None,
                     max_new_tokens: int | None = None) -> Protocol:
    """``default`` with a global token budget, then the per-benchmark overrides, applied.

    Switching family (``kind``, or ``temperature`` 0 <-> > 0) starts from that family's defaults
    (greedy: n 1; sample: T 0.6, top-p 0.95); changing ``n`` without ``ks`` reports pass@n.
    """
    ov = override if isinstance(override, dict) else (override.model_dump(exclude_none=True)
                                                       if override is not None else {})
    ov = {k: v for k, v in ov.items() if v is not None}
    data = default.model_dump()
    if max_new_tokens is not None:
        data["max_new_tokens"] = max_new_tokens
    kind = ov.get("kind")
    if kind is None and "temperature" in ov:
        kind = "greedy" if ov["temperature"] == 0 else "sample"
    kind = kind or data["kind"]
    if kind != data["kind"]:
        budget = data["max_new_tokens"]
        data = (dict(kind="greedy", temperature=0.0, top_p=1.0, n=1, ks=(1,)) if kind == "greedy"
                else dict(kind="sample", temperature=0.6, top_p=0.95, n=1))
        data["max_new_tokens"] = budget
    if "n" in ov and "ks" not in ov and kind == "sample":
        data["ks"] = (ov["n"],)
    data.update(ov)
    if kind == "sample" and "ks" not in data:
        data["ks"] = (data["n"],)
    return Protocol.model_validate(data)


def _spec_map(ev: Any) -> dict[str, Any]:
    return ev.specs(SYNTHETIC)


def check_eval_config(ev: Any) -> None:
    """Field-level checks of an EvalConfig (called by its validator): names and protocols."""
    specs = _spec_map(ev)
    if not specs:
        raise EvalPlanError(f"eval.benchmarks is empty; name at least one of: {_allowed()}")
    for name, spec in specs.items():
        if name not in BENCHMARKS:
            raise EvalPlanError(f"eval.benchmarks: unknown benchmark {name!r}; allowed: {_allowed()}")
        try:
            protocol = protocol_for(name, spec, ev)
        except ValueError as err:
            errors = getattr(err, "errors", None)  # a pydantic ValidationError of Protocol
            msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in errors()) if errors else str(err)
            hint = " (its registry protocol is greedy: set temperature > 0 to sample)" if (
                get_benchmark(name).protocol.kind == "greedy" and spec.protocol.temperature is None) else ""
            raise EvalPlanError(f"eval.benchmarks.{name}.protocol: {msg}{hint}") from None
        headline = getattr(spec, "headline", None)
        if headline is not None and headline not in protocol.metric_names:
            raise EvalPlanError(f"eval.benchmarks.{name}.headline: {headline!r} is not a metric of its protocol; "
                                f"allowed: {', '.join(protocol.metric_names)}")
    trained = trained_names(specs)
    for name in ev.curve_benchmarks or ():
        if name not in specs:
            raise EvalPlanError(f"eval.curve_benchmarks: {name!r} is not in eval.benchmarks; allowed: "
                                f"{', '.join(specs)}")
        if name not in trained:  # no trained cell evaluates it, so no snapshot does
            raise EvalPlanError(f"eval.curve_benchmarks: {name!r} is measured before training only (set "
                                f"eval.benchmarks.{name}.trained: true to evaluate trained cells on it); allowed: "
                                f"{', '.join(trained) or 'none'}")


def trained_names(specs: dict[str, Any]) -> list[str]:
    """The benchmarks of ``specs`` trained cells are evaluated on: all but those the registry measures before
    training (``before_training``), unless a study's entry says ``trained: true`` (``false`` leaves any out)."""
    return [n for n, s in specs.items()
            if (s.trained if getattr(s, "trained", None) is not None else not get_benchmark(n).before_training)]


def protocol_for(name: str, spec: Any, ev: Any) -> Protocol:
    """The protocol benchmark ``name`` is evaluated under in a cell with eval settings ``ev``."""
    budget = ev.max_new_tokens
    if name == SYNTHETIC and budget is None:
        budget = get_benchmark(SYNTHETIC).protocol.max_new_tokens
    return resolve_protocol(get_benchmark(name).protocol, spec.protocol, budget)
