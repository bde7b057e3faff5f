"""Signatures (short hashes) of a resolved cell config: what names a trained cell, and what names
its evaluations.  Pure python (pydantic only), imported by the study, the plan and the trainer.

* :func:`signature_dump`: the config as JSON without its *runtime* fields, i.e. fields declared
  ``Field(..., json_schema_extra={"runtime": True})`` (memory/batching/checkpoint cadence: they
  never change results, so changing one reruns nothing), without fields marked
  ``signature_omits_default`` while at their default (added later: adding one reruns nothing),
  plus the derived keys a model's
  ``signature_extras()`` names (TrainConfig: updates per step when it is not 1);
* :func:`train_signature`: what training depends on = the dump without the evaluation-only
  settings (``eval.*`` except ``eval.eval_every``, which decides which snapshots training writes).
  It is THE cell hash: MLflow tag ``lorarl.config_hash``, ``cell.json``, checkpoint validity and
  the Snakemake rerun trigger of train/diagnose;
* :func:`eval_settings_signature`: the evaluation-only settings, so adding a benchmark changes it
  and never the training signature (a checkpoint of a cell mid-training stays valid);
* :func:`identity_signature`: every field (runtime ones included): two cells merge only when
  their resolved configs are identical in every field.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any, get_args

from pydantic import BaseModel

EVAL_SECTION = "eval"  # the section holding evaluation settings (CellConfig.eval)
TRAIN_READS_FROM_EVAL = ("eval_every",)  # eval fields that change what training writes (snapshots)


def short_hash(obj: Any) -> str:
    """10 hex digits of the SHA-256 of ``obj``'s canonical JSON."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def is_runtime(info: Any) -> bool:
    """Whether a pydantic FieldInfo is marked ``json_schema_extra={"runtime": True}``."""
    extra = getattr(info, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("runtime"))


@lru_cache(maxsize=None)
def runtime_fields(cls: type[BaseModel]) -> frozenset[str]:
    """Names of the fields of ``cls`` (not nested) marked runtime."""
    return frozenset(n for n, info in cls.model_fields.items() if is_runtime(info))


@lru_cache(maxsize=None)
def omitted_at_default(cls: type[BaseModel]) -> dict[str, Any]:
    """Fields of ``cls`` marked ``json_schema_extra={"signature_omits_default": True}`` -> their default's
    JSON value: a field added after cells were trained enters the signature only when set otherwise, so
    adding it reruns nothing while every cell that uses it gets its own hash."""
    out = {}
    for n, info in cls.model_fields.items():
        extra = getattr(info, "json_schema_extra", None)
        if isinstance(extra, dict) and extra.get("signature_omits_default"):
            out[n] = json.loads(json.dumps(info.default, default=str))
    return out


def models_in(tp: Any) -> list[type[BaseModel]]:
    """The pydantic model classes named anywhere in a type annotation (``dict[str, X] | None`` -> [X])."""
    out = [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []
    for arg in get_args(tp):
        out += models_in(arg)
    return out


@lru_cache(maxsize=None)
def _descend(cls: type[BaseModel]) -> frozenset[str]:
    """Fields of ``cls`` whose value may hold a model with runtime fields somewhere inside."""
    return frozenset(n for n, info in cls.model_fields.items()
                     if any(_has_runtime(m) for m in models_in(info.annotation) if m is not cls))


@lru_cache(maxsize=None)
def _has_runtime(cls: type[BaseModel]) -> bool:
    return bool(runtime_fields(cls)) or bool(_descend(cls)) or _has_extras(cls) or bool(omitted_at_default(cls))


def _extras(model: BaseModel) -> dict[str, Any]:
    """Derived keys a model adds to its signature (``signature_extras()``; e.g. TrainConfig's updates per
    step, so a changed meaning of a field changes the hash of exactly the cells it changes)."""
    fn = getattr(model, "signature_extras", None)
    return fn() if callable(fn) else {}


@lru_cache(maxsize=None)
def _has_extras(cls: type[BaseModel]) -> bool:
    return callable(getattr(cls, "signature_extras", None))


def _strip(value: Any, dumped: Any) -> Any:
    """``dumped`` (the JSON dump of ``value``) without the runtime fields of any model inside."""
    if isinstance(value, BaseModel):
        cls = type(value)
        if not _has_runtime(cls):
            return dumped
        drop, down, omit = runtime_fields(cls), _descend(cls), omitted_at_default(cls)
        out = {k: (_strip(getattr(value, k), v) if k in down else v) for k, v in dumped.items()
               if k not in drop and not (k in omit and v == omit[k])}
        return {**out, **_extras(value)}
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {k: _strip(value.get(k), v) for k, v in dumped.items()}
    if isinstance(value, (list, tuple)) and isinstance(dumped, list):
        return [_strip(a, b) for a, b in zip(value, dumped)]
    return dumped


def signature_dump(cfg: BaseModel) -> dict[str, Any]:
    """The JSON dump of ``cfg`` without its runtime fields (at any depth)."""
    return _strip(cfg, cfg.model_dump(mode="json"))


def _train_part(d: dict[str, Any]) -> dict[str, Any]:
    if isinstance(d.get(EVAL_SECTION), dict):
        d = {**d, EVAL_SECTION: {k: d[EVAL_SECTION][k] for k in TRAIN_READS_FROM_EVAL if k in d[EVAL_SECTION]}}
    return d


def train_signature(cfg: BaseModel) -> str:
    """Hash of what training depends on (no runtime fields, no evaluation-only settings)."""
    return short_hash(_train_part(signature_dump(cfg)))


def eval_settings_signature(cfg: BaseModel) -> str:
    """Hash of the evaluation-only settings (runtime fields excluded); '' for configs without any."""
    ev = signature_dump(cfg).get(EVAL_SECTION)
    if not isinstance(ev, dict):
        return ""
    return short_hash({k: v for k, v in ev.items() if k not in TRAIN_READS_FROM_EVAL})


def identity_signature(cfg: BaseModel) -> str:
    """Hash of every field: identical cells (same value everywhere) merge."""
    return short_hash(cfg.model_dump(mode="json"))


def signatures(cfg: BaseModel) -> tuple[str, str, str]:
    """(identity, training, evaluation-settings) signatures of ``cfg`` from one dump."""
    full = cfg.model_dump(mode="json")
    d = _strip(cfg, full)
    ev = d.get(EVAL_SECTION)
    ev_sig = short_hash({k: v for k, v in ev.items() if k not in TRAIN_READS_FROM_EVAL}) if isinstance(ev, dict) else ""
    return short_hash(full), short_hash(_train_part(d)), ev_sig
