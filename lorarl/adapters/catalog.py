"""Lookups over the registered PEFT methods: `get_method`, `check_config`, `describe`.

Importing this module registers the built-in methods (`lorarl.adapters.methods`, light at import);
`lorarl.adapters.registry` holds the `Method` spec and `@register`, which method modules import.
"""

from __future__ import annotations

from typing import Any, Mapping

from lorarl.adapters import methods  # noqa: F401  (registers every built-in method)
from lorarl.adapters.registry import FIELDS, REGISTRY, AdapterSpecError, Method


def get_method(name: str) -> Method:
    if name not in REGISTRY:
        raise AdapterSpecError(f"unknown adapter.method {name!r}; allowed: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def check_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate an adapter config (a mapping of AdapterConfig fields); return the applied settings.

    Errors name the field, the method, and what is allowed. Fields that do not apply must be null.
    """
    method = get_method(values.get("method", "lora"))
    applies = method.applicable(values)
    for f in FIELDS:
        v = values.get(f)
        if v is not None and f not in applies:
            ok = ", ".join(applies) or "none besides `method`"
            raise AdapterSpecError(
                f"adapter.{f}={v!r} does not apply to method {method.name!r} ({method.summary}); "
                f"set it to null or drop it. Fields that apply to {method.name}: {ok}"
            )
    init = values.get("init")
    if init is not None and init not in method.inits:
        raise AdapterSpecError(
            f"adapter.init={init!r} is not available for method {method.name!r}; allowed: {', '.join(method.inits)}"
        )
    mask = values.get("mask")
    if mask is not None and mask not in method.masks:
        raise AdapterSpecError(
            f"adapter.mask={mask!r} is not available for method {method.name!r}; allowed: {', '.join(method.masks)}"
        )
    return method.resolve(values)


def describe() -> list[dict[str, Any]]:
    """One row per method: what applies, defaults (callables shown by name), inits, masks."""
    rows = []
    for m in REGISTRY.values():
        rows.append({
            "method": m.name, "summary": m.summary, "peft_type": m.peft_type, "fields": list(m.fields),
            "defaults": {k: (getattr(v, "__doc__", None) or "derived") if callable(v) else v
                         for k, v in m.defaults.items()},
            "inits": list(m.inits), "masks": list(m.masks),
        })
    return rows

