"""The files an adaptive decision reads, turned into plain data (the pure functions take that data).

* Rung values: a cell's held-out snapshot evaluation ``results/<study>/<cell>/eval/<benchmark>@<step>.json``
  (lorarl.evaluate.records: ``metrics.<metric>.value``), written when the evaluate stage scores the
  snapshot the trainer saved at that step (``eval.eval_every``). A record whose ``meta.config_hash`` is
  not the cell's current signature is stale and counts as missing.
* Failures: a cell's ``summary.json`` whose ``state`` is ``diverged`` (lorarl.numerics.divergence: the run
  stopped on a NaN/inf at ``diverged_at_step``) or ``failed`` (``failed_at_step``, default 0). A train job
  that crashed leaves no summary: its records are missing and a synchronous rung waits for its rerun.
  A rung value that is not finite is a failure at that rung.
* Per-problem scores of the final evaluation ``eval/<benchmark>.jsonl`` (one line per sample:
  ``problem_id``, ``correct``) under a metric: avg@k = c / n, pass@k the unbiased estimator
  (lorarl.grading.protocols.pass_at_k); what a hypothesis pairs by problem.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.language.adaptive.blocks import split_metric
from lorarl.grading.protocols import pass_at_k

__all__ = ["rung_records", "cell_failure", "cell_bad_seed", "problem_scores", "FAILED_STATES"]

FAILED_STATES = ("diverged", "failed")  # summary.json states that end a cell without its result
_METRIC = re.compile(r"^(pass|avg)@(\d+)$")


def _read(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _current(doc: Any, cell: Any) -> bool:
    h = ((doc or {}).get("meta") or {}).get("config_hash")
    return h is None or h == cell.hash


def cell_failure(results: str | Path, study: str, cell: Any) -> int | None:
    """The training step at which ``cell`` failed (summary.json), or None."""
    doc = _read(paths.path("summary", results=results, study=study, cell=cell.id))
    if not isinstance(doc, dict) or doc.get("state") not in FAILED_STATES:
        return None
    if doc.get("config_hash") not in (None, cell.hash):
        return None  # a summary of an older config: the cell reruns
    at = doc.get("diverged_at_step") if doc["state"] == "diverged" else doc.get("failed_at_step")
    return int(at or 0)


def cell_bad_seed(results: str | Path, study: str, cell: Any) -> str | None:
    """What went wrong in ``cell``'s training, as one phrase (``diverged at step 12``, ``collapse flag
    entropy_collapse at step 30``), or None: a seed a hypothesis's claim should be read beside."""
    doc = _read(paths.path("summary", results=results, study=study, cell=cell.id))
    if not isinstance(doc, dict) or doc.get("config_hash") not in (None, cell.hash):
        return None
    if doc.get("state") in FAILED_STATES:
        at = doc.get("diverged_at_step") if doc["state"] == "diverged" else doc.get("failed_at_step")
        return f"{doc['state']} at step {int(at or 0)}"
    flags = doc.get("flags") or {}
    if flags:
        return "; ".join(f"collapse flag {name} at step {step}" for name, step in sorted(flags.items()))
    return None


def rung_records(results: str | Path, study: str, cells: list[Any], metric: str, rungs: list[int]) -> dict[str, Any]:
    """``{"values": {cell: {"<step>": value}}, "failed": {cell: step}}`` for ``cells`` (each with
    ``.id``/``.hash``) at ``rungs``; the input of lorarl.adaptive.halving.decide."""
    bench, name = split_metric(metric)
    values: dict[str, dict[str, float]] = {}
    failed: dict[str, int] = {}
    for cell in cells:
        at = cell_failure(results, study, cell)
        if at is not None:
            failed[cell.id] = at
        for step in rungs:
            doc = _read(paths.path("eval_step_summary", results=results, study=study, cell=cell.id,
                                   benchmark=bench, step=step))
            if not isinstance(doc, dict) or not _current(doc, cell):
                continue
            m = (doc.get("metrics") or {}).get(name)
            if m is None:
                continue
            v = float(m["value"])
            if not math.isfinite(v):
                failed[cell.id] = min(step, failed.get(cell.id, step))
                continue
            values.setdefault(cell.id, {})[str(step)] = v
    return {"values": values, "failed": failed}


def _score(n: int, c: int, metric: str) -> float:
    m = _METRIC.match(metric)
    if m is None:
        raise ValueError(f"metric {metric!r}: allowed: avg@<k>, pass@<k>")
    k = int(m.group(2))
    return c / n if m.group(1) == "avg" else pass_at_k(n, c, k)


def problem_scores(results: str | Path, study: str, cell: Any, metric: str) -> dict[str, float] | None:
    """Problem id -> the cell's final-evaluation score under ``metric`` (``<benchmark>/<metric>``), or
    None when the evaluation is missing or stale."""
    bench, name = split_metric(metric)
    summary = _read(paths.path("eval_summary", results=results, study=study, cell=cell.id, benchmark=bench))
    if not isinstance(summary, dict) or not _current(summary, cell):
        return None
    try:
        text = paths.path("eval_samples", results=results, study=study, cell=cell.id, benchmark=bench).read_text()
    except FileNotFoundError:
        return None
    counts: dict[str, list[int]] = {}
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            nc = counts.setdefault(str(row["problem_id"]), [0, 0])
            nc[0] += 1
            nc[1] += bool(row["correct"])
    return {p: _score(n, c, name) for p, (n, c) in sorted(counts.items())} or None
