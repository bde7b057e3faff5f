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
from lorarl.adaptive.records import cell_bad_seed, cell_failure, problem_scores, rung_records
from lorarl.language.adaptive.seeds import comparison_seeds
from lorarl.language.adaptive.settings import study_settings
from lorarl.language.adaptive.blocks import check_metric, resolved_search
from lorarl.io import atomic_write_text
from lorarl.language.matrix import label_of

__all__ = ["search_path", "hypotheses_path", "render", "write_if_changed", "read", "update_search",
           "cell_plan", "stopped_now", "hypothesis_observations", "hypothesis_censored", "update_hypotheses", "censored_cells",
           "started_cells"]


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


def stopped_now(study: Any, table: Any, results: str | Path, led: dict[str, Any] | None = None) -> dict[str, int]:
    """Cell id -> the rung step it stopped at, for the cells of settings the search stopped (or failed) that have
    not finished since (a promotion or ``--config search=off`` trains a stopped cell on): censored cells. A failed
    setting's healthy cells wait at the rung like stopped ones."""
    if study.search is None:
        return {}
    led = led if led is not None else read(search_path(results, study.name))
    out: dict[str, int] = {}
    for name, st in (led or {}).get("state", {}).items():
        if st.get("state") not in ("stopped", "failed"):
            continue
        for cid in led["settings"][name]["cells"]:
            summary = read(paths.path("summary", results=results, study=study.name, cell=cid))
            try:
                current = table.cell(cid).hash
            except Exception:  # noqa: BLE001 - a ledger of other settings
                continue
            if not (summary and summary.get("config_hash") == current):
                out[cid] = int(st["rung"])
    return out


def _started(results: str | Path, study: str, cells: tuple[str, str]) -> bool:
    """An added seed is in the study once the workflow started one of its cells (its folder exists)."""
    return any(paths.cell_dir(results, study, c).is_dir() for c in cells)


def started_cells(study: Any, table: Any, results: str | Path) -> list[Any]:
    """The study's cells, then the cells of the seeds a hypothesis added that the workflow started (their folder
    exists): every cell a table, a figure, a count or `lorarl status` shows."""
    extra = [c for c in table.extra_cells() if paths.cell_dir(results, study.name, c.id).is_dir()]
    return list(table.cells) + extra


def hypothesis_observations(study: Any, table: Any, results: str | Path, spec: Any, metric: str,
                            n: int | None = None) -> list[tuple[str, Any]]:
    """(seed, paired difference | None | FAILED) in seed order: the first ``n`` seeds of the comparison (a look),
    else the axis's seeds and the added seeds the workflow started (lorarl.language.adaptive.seeds)."""
    seeds = comparison_seeds(study, table, spec)
    if n is not None:
        seeds = seeds[:n]
    else:
        axis = len(study.axes[study.seed_axis].values)
        seeds = [s for i, s in enumerate(seeds) if i < axis or _started(results, study.name, s[1:])]
    out: list[tuple[str, Any]] = []
    for seed, a, b in seeds:
        ca, cb = table.cell(a), table.cell(b)
        if cell_failure(results, study.name, ca) is not None or cell_failure(results, study.name, cb) is not None:
            out.append((seed, FAILED))
            continue
        out.append((seed, paired_difference(problem_scores(results, study.name, ca, metric),
                                            problem_scores(results, study.name, cb, metric), spec.direction)))
    return out


def hypothesis_censored(study: Any, table: Any, results: str | Path, spec: Any) -> bool:
    """A side has a cell the search stopped (read from ``search.json``) that has not finished since: its final
    metric is not observed. Once ``--config search=off`` (or a promotion) trains such a cell to its end, the
    hypothesis is decided from it like any other (lorarl.adaptive.ledger.stopped_now)."""
    stopped = stopped_now(study, table, results)
    return any(c in stopped for _, a, b in comparison_seeds(study, table, spec) for c in (a, b))


def bad_seeds(study: Any, table: Any, results: str | Path, spec: Any, seeds: set[str]) -> dict[str, str]:
    """seed -> what went wrong in its cell of a or b (diverged, a collapse flag), for the seeds observed."""
    out = {}
    for seed, a, b in comparison_seeds(study, table, spec):
        if seed not in seeds:
            continue
        said = [f"{side}: {w}" for side, c in (("a", a), ("b", b))
                if (w := cell_bad_seed(results, study.name, table.cell(c))) is not None]
        if said:
            out[seed] = "; ".join(said)
    return out


def update_hypotheses(study: Any, table: Any, results: str | Path = "results") -> dict[str, Any]:
    """Every hypothesis's state from the final evaluations on disk, written to ``hypotheses.json``;
    a side with a cell the search stopped and that has not finished since is censored (hypothesis_censored)."""
    out: dict[str, Any] = {}
    for name, h in study.hypotheses.items():
        metric = check_metric(table, h.metric, f"hypotheses.{name}.metric", "<study>", curve=False)
        obs = hypothesis_observations(study, table, results, h, metric)
        state = hypothesis_state(h, obs, censored=hypothesis_censored(study, table, results, h))
        out[name] = {**state, "metric": metric, "a": {k: label_of(v) for k, v in h.a.items()},
                     "b": {k: label_of(v) for k, v in h.b.items()},
                     "observations": [{"seed": s, "difference": d} for s, d in obs],
                     "bad_seeds": bad_seeds(study, table, results, h, {s for s, _ in obs})}
    doc = {"version": 1, "hypotheses": out}
    write_if_changed(hypotheses_path(results, study.name), doc)
    return doc
