"""Successive halving over rungs, as a pure function of the rung records: :func:`decide`.

Inputs (plain data, so a test, a replay and the workflow call it alike):

* ``spec``: the resolved `search:` block (lorarl.language.adaptive.blocks.resolved_search: rungs, metric, eta,
  min_kept, direction, rule);
* ``settings``: the study's settings in arrival order (lorarl.language.adaptive.settings.study_settings);
* ``records``: ``{"values": {cell: {rung_step: value}}, "failed": {cell: step}}`` (lorarl.adaptive.records
  reads them from the cells' own evaluation files; a value that is not finite counts as a failure);
* ``previous``: the last ledger (lorarl.adaptive.ledger) or None.

The rules (docs/adaptive.md says the same for users):

* A setting's value at a rung is the mean over its cells (the paired axes, e.g. seeds); it has a
  value once every one of its cells has recorded that rung. It **fails** at a rung when one of its
  cells failed at or before that step (summary.json ``state`` ``diverged``/``failed``, or a non-finite
  value): a failed setting is never ranked or promoted, and does not lower the number kept.
* Ranking: better value first (``direction``); ties are broken by the previous rungs' values (latest
  first), then by the sha256 of the setting's name: never by arrival order or axis order. Values are
  compared rounded to ``PLACES`` decimal places (:func:`exact`), so a float's last bit (0.015 vs
  0.015000000000000001, two sums of the same scores in another order) never decides a tie. A setting whose
  side of the keep line was decided by the hash (tied at every rung with one on the other side) is listed
  in its rung's ``hash_ties``.
* ``keep = min(recorded, max(min_kept, floor(N / eta)))`` for a rung that N settings reached.
* ``sha``: a rung decides when each of its N settings has a value or has failed (a missing record
  waits: no decision); the best ``keep`` are promoted, the others stopped (censored at that rung).
* ``asha``: settings reach a rung in a fixed arrival order (the study's order at the first rung; the
  order of promotion after that). For every prefix of that order whose settings have all recorded
  (or failed), the best ``floor(r / eta)`` of its r recorded settings are promoted at once (so nothing
  is promoted before eta settings are in: Optuna promotes the first trials; lorarl does not); when
  the whole rung is in, the best ``keep`` are promoted as under ``sha`` and the rest stopped. The
  fixed order, not the wall clock, is what makes the decisions a pure function of the records: a
  kill of anything changes when a decision is made, never which.
* Decisions are only ever added: with the same records more records add decisions and change none.
  With a ``previous`` ledger of the same rule and settings, every decision it holds is kept as it
  was (a record rewritten since then is listed in ``conflicts``, never acted on); a changed `search:`
  block (or set of settings) re-decides everything from the records.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Sequence

from lorarl.language.adaptive.settings import Setting, tie_key

__all__ = ["decide", "inputs_hash", "PROMOTE", "STOP", "FAIL"]

PROMOTE, STOP, FAIL = "promote", "stop", "fail"
VERSION = 2  # of the rules above: part of the inputs hash (a new rule re-decides)
PLACES = 12  # decimal places a rung value is compared at: far below any metric's resolution (1 / problems x samples)


def exact(v: float) -> float:
    """A rung value as ranked: rounded to ``PLACES`` decimals (Python's correctly rounded ``round``)."""
    return round(v, PLACES)


def _spec_dict(spec: Any) -> dict[str, Any]:
    return spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)


def inputs_hash(spec: Any, settings: Sequence[Setting]) -> str:
    """sha256 of the rule (the resolved `search:` block, the rules' version) and the settings."""
    blob = json.dumps({"version": VERSION, "rule": _spec_dict(spec),
                       "settings": [[s.name, list(s.cells)] for s in settings]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _status(s: Setting, step: int, records: dict[str, Any]) -> tuple[str, float | None, dict[str, float]]:
    """("ok", mean, per-cell values) | ("failed", None, {}) | ("missing", None, values so far)."""
    failed, values = records.get("failed", {}), records.get("values", {})
    got: dict[str, float] = {}
    for cid in s.cells:
        at = failed.get(cid)
        v = values.get(cid, {}).get(str(step), values.get(cid, {}).get(step))
        if (at is not None and int(at) <= step) or (v is not None and not math.isfinite(float(v))):
            return "failed", None, {}
        if v is not None:
            got[cid] = float(v)
    if len(got) < len(s.cells):
        return "missing", None, got
    return "ok", math.fsum(got.values()) / len(got), got


def _values_key(sign: float, history: dict[str, list[float | None]], name: str) -> tuple:
    return tuple(-sign * exact(v) if v is not None else math.inf for v in reversed(history[name]))


def _ranker(sign: float, history: dict[str, list[float | None]]):
    def key(name: str) -> tuple:
        return _values_key(sign, history, name) + (tie_key(name),)
    key.values = lambda name: _values_key(sign, history, name)  # the key without the hash
    return key


def _hash_ties(ranked: list[str], cut: int, rank) -> list[str]:
    """The settings of ``ranked`` (best first) tied, at every rung, with one on the other side of position ``cut``:
    the hash put them on their side."""
    if not 0 < cut < len(ranked):
        return []
    edge = {rank.values(ranked[cut - 1]), rank.values(ranked[cut])}
    return [n for n in ranked if len(edge) == 1 and rank.values(n) in edge]


def _previous(previous: dict[str, Any] | None, digest: str) -> dict[int, dict[str, Any]]:
    """Rung step -> {"decided": {name: decision}, "promoted": [order]} of a previous ledger of the same inputs."""
    if not previous or previous.get("inputs_hash") != digest:
        return {}
    return {int(r["step"]): {"decided": dict(r.get("decided", {})), "promoted": list(r.get("promoted", [])),
                             "basis": dict(r.get("basis", {}))} for r in previous.get("rungs", [])}


def _fresh(alive: list[str], status: dict[str, tuple], rank, rule: str, eta: int, min_kept: int,
           complete: bool) -> tuple[dict[str, str], list[str], dict[str, str], int | None, list[str]]:
    """Decisions at one rung from its records alone: (decided, promotion order, basis, keep, hash ties)."""
    decided: dict[str, str] = {}
    order: list[str] = []
    basis: dict[str, str] = {}
    ties: list[str] = []
    for n in alive:
        if status[n][0] == "failed":
            decided[n], basis[n] = FAIL, "a cell failed at or before this step"
    if rule == "asha":
        seen: list[str] = []
        for n in alive:
            if status[n][0] == "missing":
                break  # the arrival order waits for this setting
            if status[n][0] == "ok":
                seen.append(n)
            q = len(seen) // eta
            ranked = sorted(seen, key=rank)
            for t in ranked[:q]:
                if t not in decided:
                    ties += [n for n in _hash_ties(ranked, q, rank) if n == t and n not in ties]
                    decided[t], basis[t] = PROMOTE, f"asha: in the best {q} of the first {len(seen)} recorded"
                    order.append(t)
    keep = None
    if complete:
        ok = sorted((n for n in alive if status[n][0] == "ok"), key=rank)
        keep = min(len(ok), max(min_kept, len(alive) // eta))
        ties += [n for n in _hash_ties(ok, keep, rank) if n not in ties and n not in decided]
        for i, n in enumerate(ok):
            if n in decided:
                continue
            if i < keep:
                decided[n], basis[n] = PROMOTE, f"rung complete: rank {i + 1}, best {keep} of {len(alive)} kept"
                order.append(n)
            else:
                decided[n], basis[n] = STOP, f"rung complete: rank {i + 1}, best {keep} of {len(alive)} kept"
    for n in ties:
        basis[n] += "; tied with a setting on the other side of the cut at every rung: decided by the name's sha256"
    return decided, order, basis, keep, ties


def decide(spec: Any, settings: Sequence[Setting], records: dict[str, Any],
           previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ledger's decisions (a JSON-able dict; lorarl.adaptive.ledger writes it): per rung its
    arrival order, the values used, what was decided and why; per setting its state; the flat list
    of decisions; and ``conflicts`` (earlier decisions the current records would not make)."""
    sp = _spec_dict(spec)
    rungs, eta, min_kept = [int(r) for r in sp["rungs"]], int(sp["eta"]), int(sp["min_kept"])
    sign = 1.0 if sp.get("direction", "max") == "max" else -1.0
    digest = inputs_hash(spec, settings)
    prev = _previous(previous, digest)
    by_name = {s.name: s for s in settings}
    history: dict[str, list[float | None]] = {s.name: [] for s in settings}
    alive = [s.name for s in settings]
    prev_complete = True
    out_rungs, decisions, conflicts = [], [], []
    state: dict[str, dict[str, Any]] = {}
    for step in rungs:
        status = {n: _status(by_name[n], step, records) for n in alive}
        for n in alive:
            history[n].append(status[n][1])
        complete = prev_complete and all(status[n][0] != "missing" for n in alive)
        decided, order, basis, keep, ties = _fresh(alive, status, _ranker(sign, history), sp.get("rule", "sha"),
                                             eta, min_kept, complete)
        before = prev.get(step, {"decided": {}, "promoted": [], "basis": {}})
        for n, d in before["decided"].items():
            if n in by_name and decided.get(n) != d:
                conflicts.append({"setting": n, "rung": step, "kept": d, "records_say": decided.get(n)})
        final = {n: d for n, d in decided.items() if n not in before["decided"]}
        final.update({n: d for n, d in before["decided"].items() if n in by_name})
        promoted = [n for n in before["promoted"] if final.get(n) == PROMOTE]
        promoted += [n for n in order if n not in promoted and final.get(n) == PROMOTE]
        for n in alive:
            if n in final:
                why = before["basis"].get(n, "earlier decision (ledger)") if n in before["decided"] else basis[n]
                basis[n] = why
                decisions.append({"setting": n, "rung": step, "decision": final[n], "value": status[n][1],
                                  "basis": why})
                if final[n] != PROMOTE:
                    state[n] = {"state": {STOP: "stopped", FAIL: "failed"}[final[n]], "rung": step}
            else:
                state[n] = {"state": "waiting" if status[n][0] == "ok" else "running", "rung": step}
        out_rungs.append({
            "step": step, "complete": complete, "keep": keep, "arrival": list(alive),
            "values": {n: ({"mean": status[n][1], "cells": status[n][2]} if status[n][0] != "failed" else None)
                       for n in alive},
            "decided": {n: final[n] for n in alive if n in final}, "promoted": promoted,
            "basis": {n: basis[n] for n in alive if n in final},
            "hash_ties": [n for n in alive if n in final and "decided by the name's sha256" in basis[n]],
        })
        alive, prev_complete = promoted, complete
    for n in alive:  # promoted at the last rung: trains to the end
        state[n] = {"state": "finishing", "rung": None}
    return {"version": VERSION, "inputs_hash": digest, "rule": sp,
            "settings": {s.name: s.to_dict() for s in settings}, "rungs": out_rungs,
            "decisions": decisions, "state": {s.name: state.get(s.name, {"state": "running", "rung": rungs[0]})
                                              for s in settings},
            "conflicts": conflicts}
