"""An adaptive study's decisions in the report (docs/adaptive.md): censored cells, the search, the hypotheses.

Read from the ledgers the decision jobs write (lorarl.adaptive.ledger: ``results/<study>/adaptive/search.json``,
``hypotheses.json``) and the cells' own files; nothing here decides anything.

* A cell the search stopped is **censored** at its rung: its row says ``state`` ``stopped`` and
  ``stopped_at_step`` (its metrics at the last step are unobserved, never zero, never failed); a cell stopped
  at a rung and later trained to its end (a promotion, ``--config search=off``) is an ordinary finished cell.
* :func:`search_table`: one row per setting: its rung values, what the search decided, the cell-steps it got.
* :func:`hypotheses_table`: one row per hypothesis: decision, estimate and interval at the deciding look,
  seeds used against its cap, the cell-steps its two settings used against the fixed design at that cap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from lorarl import paths

STOPPED = "stopped"  # a censored cell's state in the tables and `lorarl status`


def _read(p: Path) -> dict | None:
    try:
        doc = json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def search_ledger(study: Any, results: str | Path) -> dict | None:
    return _read(paths.path("search_ledger", results=results, study=study.name)) if study.search is not None else None


def hypotheses_ledger(study: Any, results: str | Path) -> dict | None:
    return _read(paths.path("hypotheses_ledger", results=results, study=study.name)) if study.hypotheses else None


def censored(study: Any, table: Any, results: str | Path, ledger: dict | None = None) -> dict[str, int]:
    """Cell id -> the rung step it was stopped at (lorarl.adaptive.ledger.stopped_now)."""
    from lorarl.adaptive.ledger import stopped_now

    return stopped_now(study, table, results, ledger)


def report_cells(study: Any, table: Any, results: str | Path) -> list[Any]:
    """The study's cells, then the seeds a hypothesis added that the workflow started (their folder exists)."""
    from lorarl.adaptive.ledger import started_cells

    return started_cells(study, table, results)


def censored_rows(study: Any, table: Any, results: str | Path) -> list[dict]:
    return [{"cell": cid, **table.cell(cid).axes, "state": STOPPED, "stopped_at_step": step}
            for cid, step in censored(study, table, results).items()]


def cell_steps(study: Any, table: Any, results: str | Path) -> dict[str, int]:
    """Training steps each cell got so far: its last step when finished, else its last rung mark (0: none)."""
    out = {}
    for c in report_cells(study, table, results):
        doc = _read(paths.path("summary", results=results, study=study.name, cell=c.id))
        if doc is not None and doc.get("config_hash") == c.hash:
            out[c.id] = int(doc.get("steps") or c.config.train.steps)
            continue
        marks = sorted(int(p.stem.split("-")[1]) for p in paths.cell_dir(results, study.name, c.id).glob("rungs/step-*.json"))
        out[c.id] = marks[-1] if marks else 0
    return out


def setting_cells(study: Any, table: Any, results: str | Path, led: dict, name: str) -> list[str]:
    """A setting's cells: the search's (its seed-axis cells), then the seeds a hypothesis added to it that the
    workflow started (they train straight through, outside the search, but their steps are spent all the same)."""
    labels = led["settings"][name]["labels"]
    added = [c.id for c in report_cells(study, table, results)[len(table.cells):]
             if all(c.axes.get(a) == lab for a, lab in labels.items())]
    return list(led["settings"][name]["cells"]) + added


def search_table(study: Any, table: Any, results: str | Path) -> pd.DataFrame:
    """Per setting: its labels, the mean metric at each rung it reached (``rung/<step>``), its state and the step
    it ended at, and the cell-steps its cells got (added seeds included) against the same cells trained to their
    end. State ``finished`` once a setting that passed the last rung has every cell finished, ``finishing``
    while one still trains; ``hash_ties``: the rungs where its side of the keep line was decided by the sha256
    of its name (tied with a setting on the other side at every rung so far: lorarl.adaptive.halving)."""
    led = search_ledger(study, results)
    if not led or not led.get("rungs"):
        return pd.DataFrame()
    spent = cell_steps(study, table, results)
    rows = []
    for name, st in led["state"].items():
        row = dict(led["settings"][name]["labels"])
        for rung in led["rungs"]:
            v = (rung["values"] or {}).get(name)
            row[f"rung/{rung['step']}"] = v["mean"] if isinstance(v, dict) else None
        cells = setting_cells(study, table, results, led, name)
        done = all(spent.get(c, 0) >= table.cell(c).config.train.steps for c in cells)
        row["state"] = "finished" if st["state"] == "finishing" and done else st["state"]
        row["stopped_at_step"] = st.get("rung") if st["state"] in (STOPPED, "failed") else None
        row["hash_ties"] = " ".join(str(r["step"]) for r in led["rungs"] if name in r.get("hash_ties", [])) or None
        row["n_cells"] = len(cells)
        row["cell_steps"] = sum(spent.get(c, 0) for c in cells)
        row["fixed_cell_steps"] = sum(table.cell(c).config.train.steps for c in cells)
        rows.append(row)
    total = {k: "all" for k in rows[0] if not k.startswith("rung/") and k not in ("state", "stopped_at_step", "hash_ties", "n_cells",
                                                                                    "cell_steps", "fixed_cell_steps")}
    rows.append({**total, "n_cells": sum(r["n_cells"] for r in rows), "cell_steps": sum(r["cell_steps"] for r in rows),
                 "fixed_cell_steps": sum(r["fixed_cell_steps"] for r in rows)})
    return pd.DataFrame(rows)


def rung_values(led: dict) -> pd.DataFrame:
    """Long: one row per setting and rung it reached: value (its mean), decision (promote/stop/fail or waiting)."""
    rows = []
    for rung in led.get("rungs", []):
        for name in rung["arrival"]:
            v = (rung["values"] or {}).get(name)
            rows.append({"setting": name, **led["settings"][name]["labels"], "step": rung["step"],
                         "value": v["mean"] if isinstance(v, dict) else None,
                         "decision": rung["decided"].get(name, "waiting")})
    return pd.DataFrame(rows)


def hypotheses_table(study: Any, table: Any, results: str | Path) -> pd.DataFrame:
    """Per hypothesis: kind, settings, margin, decision, estimate [interval] at the deciding (else the latest)
    look, seeds used / cap, the cell-steps of its two settings against the fixed design at the cap, the seeds whose
    cells diverged or raised a collapse flag, and the assumption the claim rests on (lorarl.adaptive.hypotheses)."""
    doc = hypotheses_ledger(study, results)
    if not doc:
        return pd.DataFrame()
    from lorarl.language.adaptive.seeds import comparison_seeds

    spent = cell_steps(study, table, results)
    rows = []
    for name, h in doc.get("hypotheses", {}).items():
        spec = study.hypotheses.get(name)
        if spec is None:
            continue
        seeds = comparison_seeds(study, table, spec)
        steps = max(table.cell(seeds[0][1]).config.train.steps, 1) if seeds else 0
        used = sum(spent.get(c, 0) for _, a, b in seeds for c in (a, b))
        lo, hi = (h.get("interval") or [None, None])
        rows.append({"hypothesis": name, "kind": h["kind"],
                     "setting_a": ", ".join(f"{k}={v}" for k, v in h["a"].items()),
                     "setting_b": ", ".join(f"{k}={v}" for k, v in h["b"].items()), "margin": h["margin"],
                     "decision": h["decision"], "estimate": h.get("estimate"), "ci_low": lo, "ci_high": hi,
                     "seeds_used": h["seeds_used"], "max_seeds": spec.max_seeds, "cell_steps": used,
                     "fixed_cell_steps": 2 * spec.max_seeds * steps,
                     "bad_seeds": "; ".join(f"seed {k}: {v}" for k, v in (h.get("bad_seeds") or {}).items()),
                     "assumption": h.get("assumption", "")})
    return pd.DataFrame(rows)


def search_frame(data: Any) -> pd.DataFrame:
    """:func:`search_table` of a loaded study (lorarl.report.data.StudyData)."""
    from lorarl.language.study import cell_table

    return search_table(data.study, cell_table(data.study), data.results)


def hypotheses_frame(data: Any) -> pd.DataFrame:
    from lorarl.language.study import cell_table

    return hypotheses_table(data.study, cell_table(data.study), data.results)
