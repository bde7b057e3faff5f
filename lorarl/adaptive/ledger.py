"""The ledgers of an adaptive study: files under ``results/<study>/adaptive/``, recomputed from the
cells' own records whenever asked (every call is idempotent: the same records give the same bytes,
and an unchanged file is not rewritten, so its mtime does not trigger Snakemake).

* ``search.json`` (:func:`update_search`): the rule and its inputs (the resolved `search:` block and
  the settings with their cells), per rung the arrival order, the values used (each setting's mean and
  its cells' values) and the decisions with their basis, each setting's state, the failures read, and
  ``conflicts`` (earlier decisions the records would no longer make: kept, never reversed);
* ``hypotheses.json`` (:func:`update_hypotheses`): per hypothesis its design, the per-seed paired
  differences, every look's interval, the decision and how many seeds it needs now.

:func:`cell_plan` turns a search ledger into what the workflow needs per cell: train until a rung
(``until``), to the end, or nothing more (stopped: censored at its rung; failed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.adaptive.halving import decide
from lorarl.adaptive.hypotheses import FAILED, hypothesis_state, paired_difference
from lorarl.adaptive.records import cell_failure, problem_scores, rung_records
from lorarl.adaptive.settings import seed_order, study_settings
from lorarl.adaptive.spec import check_metric, resolved_search
from lorarl.io import atomic_write_text
from lorarl.matrix import label_of

__all__ = ["search_path", "hypotheses_path", "render", "write_if_changed", "read", "update_search",
           "cell_plan", "hypothesis_observations", "update_hypotheses", "censored_cells"]


def search_path(results: str | Path, study: str) -> Path:
    return paths.path("search_ledger", results=results, study=study)


def hypotheses_path(results: str | Path, study: str) -> Path:
    return paths.path("hypotheses_ledger", results=results, study=study)


def render(doc: dict[str, Any]) -> str:
    """The ledger's bytes: sorted keys, two-space indent, no NaN/Infinity (refused, not written)."""
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_if_changed(path: str | Path, doc: dict[str, Any]) -> bool:
    """Write ``doc`` atomically unless the file already holds exactly these bytes; True if written."""
    text, path = render(doc), Path(path)
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    atomic_write_text(path, text)
    return True


def read(path: str | Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def update_search(study: Any, table: Any, results: str | Path = "results") -> dict[str, Any]:
    """Decide from the records now on disk (and the previous ledger) and write ``search.json``."""
    spec = resolved_search(study, table)
    settings = study_settings(study, table, spec.paired)
    records = rung_records(results, study.name, table.cells, spec.metric, spec.rungs)
    path = search_path(results, study.name)
    ledger = decide(spec, settings, records, read(path))
    ledger["failed"] = records["failed"]
    write_if_changed(path, ledger)
    return ledger


def cell_plan(ledger: dict[str, Any], steps: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Cell id -> ``{"state", "until", "censored"}``: ``until`` is the training step the cell may reach
    now (a rung, or its ``train.steps`` from ``steps`` once its setting passed the last rung); ``state`` is
    the setting's: running | waiting (recorded, its rung undecided) | finishing | stopped | failed."""
    out = {}
    for name, st in ledger["state"].items():
        for cid in ledger["settings"][name]["cells"]:
            until = steps[cid] if st["state"] == "finishing" else st["rung"]
            out[cid] = {"state": st["state"], "until": until, "censored": st["state"] == "stopped"}
    return out


def censored_cells(ledger: dict[str, Any] | None) -> set[str]:
    """Cells of settings the search stopped (censored at their rung)."""
    if not ledger:
        return set()
    return {c for n, st in ledger["state"].items() if st["state"] == "stopped" for c in ledger["settings"][n]["cells"]}


def _side(table: Any, study: Any, sel: dict[str, Any]) -> dict[str, Any]:
    """Seed label -> the cell of the setting ``sel`` names (non-seed axes' labels)."""
    want = {a: label_of(v) for a, v in sel.items()}
    return {c.axes[study.seed_axis]: c for c in table.cells if all(c.axes.get(a) == lab for a, lab in want.items())}


def hypothesis_observations(study: Any, table: Any, results: str | Path, spec: Any,
                            metric: str) -> list[tuple[str, Any]]:
    """(seed, paired difference | None | FAILED) in seed order, up to the first seed a side lacks a cell for."""
    a, b = _side(table, study, spec.a), _side(table, study, spec.b)
    out: list[tuple[str, Any]] = []
    for seed in seed_order(study):
        if seed not in a or seed not in b:
            break
        ca, cb = a[seed], b[seed]
        if cell_failure(results, study.name, ca) is not None or cell_failure(results, study.name, cb) is not None:
            out.append((seed, FAILED))
            continue
        out.append((seed, paired_difference(problem_scores(results, study.name, ca, metric),
                                            problem_scores(results, study.name, cb, metric), spec.direction)))
    return out


def update_hypotheses(study: Any, table: Any, results: str | Path = "results") -> dict[str, Any]:
    """Every hypothesis's state from the final evaluations on disk, written to ``hypotheses.json``;
    a side with a cell the search stopped is censored (read from ``search.json``)."""
    censored = censored_cells(read(search_path(results, study.name))) if study.search is not None else set()
    out: dict[str, Any] = {}
    for name, h in study.hypotheses.items():
        metric = check_metric(table, h.metric, f"hypotheses.{name}.metric", "<study>", curve=False)
        cells = [c.id for side in (h.a, h.b) for c in _side(table, study, side).values()]
        obs = hypothesis_observations(study, table, results, h, metric)
        state = hypothesis_state(h, obs, censored=any(c in censored for c in cells))
        out[name] = {**state, "metric": metric, "a": {k: label_of(v) for k, v in h.a.items()},
                     "b": {k: label_of(v) for k, v in h.b.items()},
                     "observations": [{"seed": s, "difference": d} for s, d in obs]}
    doc = {"version": 1, "hypotheses": out}
    write_if_changed(hypotheses_path(results, study.name), doc)
    return doc
