"""An adaptive study in the workflow: the files each rule needs, from the decisions (workflow/rules/adaptive.smk).

One :class:`AdaptiveStudy` per study with a `search:` or `hypotheses:` block, built once when Snakemake parses
the workflow. Its methods are the input functions' bodies; the decisions come from the checkpoint views
(lorarl.adaptive.flow), which the Snakefile hands in as ``get_rung(study, step, n)`` and
``get_look(study, hypothesis, n)`` (each raising Snakemake's IncompleteCheckpointException until its
checkpoint has run). ``--config search=off`` drops the search (every cell trains to its end, a stopped cell
resumes from its rung's checkpoint) and keeps the hypotheses.

Tags: a study's views live under ``results/<study>/adaptive/<tag>/``, the tag a hash of what decides them
(``search-<sha256 of the resolved block and the settings>``, ``hyp-<... of the hypotheses and the search tag>``),
so a changed block re-decides from the same records into new views and never reads an old one.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Callable

from lorarl import paths
from lorarl.adaptive.flow import ALL, FAIL, FINISH, HypothesisFlow, SearchFlow
from lorarl.adaptive.halving import inputs_hash
from lorarl.language.adaptive.seeds import comparison_seeds
from lorarl.language.adaptive.settings import study_settings
from lorarl.language.adaptive.blocks import check_metric, resolved_search, split_metric

__all__ = ["AdaptiveStudy", "search_is_off", "describe", "existing_mark", "last_mark"]


def search_is_off(value: Any) -> bool:
    """``--config search=off`` (YAML may hand it over as False)."""
    return value is False or str(value).strip().lower() in ("off", "false", "no", "0")


class AdaptiveStudy:
    def __init__(self, study: Any, table: Any, results: str, search_on: bool,
                 get_rung: Callable[[str, int, Any], dict], get_look: Callable[[str, str, int], dict]):
        self.study, self.table, self.results = study, table, results
        self.spec = resolved_search(study, table) if study.search is not None and search_on else None
        self.search: SearchFlow | None = None
        self.search_tag = ""
        if self.spec is not None:
            settings = study_settings(study, table, self.spec.paired)
            self.search_tag = "search-" + inputs_hash(self.spec, settings)[:10]
            self.search = SearchFlow(self.spec, settings, functools.partial(get_rung, study.name))
        blob = json.dumps({"h": {n: h.model_dump(mode="json") for n, h in study.hypotheses.items()},
                           "search": self.search_tag}, sort_keys=True)
        self.hyp_tag = "hyp-" + hashlib.sha256(blob.encode()).hexdigest()[:10]
        self.hyps = {n: HypothesisFlow(h, comparison_seeds(study, table, h), functools.partial(get_look, study.name, n))
                     for n, h in study.hypotheses.items()}
        self.metrics = {n: check_metric(table, h.metric, f"hypotheses.{n}.metric", "<study>", curve=False)
                        for n, h in study.hypotheses.items()}

    def ledger_now(self) -> tuple[dict, dict]:
        """(the search's decisions from the records on disk now, those records): nothing written."""
        from lorarl.adaptive import ledger
        from lorarl.adaptive.halving import decide
        from lorarl.adaptive.records import rung_records

        settings = study_settings(self.study, self.table, self.spec.paired)
        records = rung_records(self.results, self.study.name, self.table.cells, self.spec.metric, self.spec.rungs)
        return decide(self.spec, settings, records, ledger.read(ledger.search_path(self.results, self.study.name))), records

    @property
    def active(self) -> bool:
        return self.search is not None or bool(self.hyps)

    def _kw(self, cell: str) -> dict:
        return dict(results=self.results, study=self.study.name, cell=cell)

    # ---- rules -----------------------------------------------------------------------------------
    def train_inputs(self, cell: str) -> list[str]:
        """The `train` rule (to the end): the last rung's mark, once the cell's setting was promoted there."""
        return self.search.final_inputs(self.results, self.study.name, cell) if self.search else []

    def segment_inputs(self, cell: str, step: int) -> list[str]:
        return self.search.segment_inputs(self.results, self.study.name, cell, step) if self.search else []

    def step_eval_inputs(self, cell: str, step: int) -> list[str] | None:
        return self.search.step_eval_inputs(self.results, self.study.name, cell, step) if self.search else None

    def view_inputs(self, step: int, n: Any) -> tuple[list[str], list[str]]:
        """(marks, rung evaluations) a rung's view decides from."""
        k = self.search.rungs.index(step)
        bench, _ = split_metric(self.spec.metric)
        cells = self.search.view_cells(k, n if n == ALL else int(n))
        return ([str(paths.path("rung_mark", step=step, **self._kw(c))) for c in cells],
                [str(paths.path("eval_step_summary", benchmark=bench, step=step, **self._kw(c))) for c in cells])

    def look_inputs(self, name: str, n: int) -> list[str]:
        """The final records a hypothesis's look n reads: summary and evaluation of both settings, first n seeds."""
        bench, _ = split_metric(self.metrics[name])
        out = []
        for c in self.hyps[name].look_cells(n):
            out += [str(paths.path("summary", **self._kw(c))), str(paths.path("eval_summary", benchmark=bench, **self._kw(c))),
                    str(paths.path("eval_samples", benchmark=bench, **self._kw(c)))]
        return out

    def aggregate_inputs(self, cell_outputs: Callable[[str], list[str]]) -> list[str]:
        """Every file the tables read, as far as the decisions go: a promoted cell's outputs, a stopped cell's mark
        and snapshots up to its rung (censored), the cells every hypothesis used. ``cell_outputs(cell)``: what
        a grid study asks of a cell."""
        out: list[str] = []
        for c in self.table.cells:
            out += self._cell_files(c, cell_outputs)
        for name, hf in self.hyps.items():
            if self._censored(name):
                continue
            for c in hf.used_cells():
                out += cell_outputs(c)
        return list(dict.fromkeys(out))

    def _cell_files(self, cell: Any, cell_outputs: Callable[[str], list[str]]) -> list[str]:
        if self.search is None or cell.id not in self.search.setting_of:
            return cell_outputs(cell.id)
        fate, k = self.search.fate(self.search.setting_of[cell.id])
        if fate == FINISH:
            return cell_outputs(cell.id)
        step = self.search.rungs[k]
        kw = self._kw(cell.id)
        files = [str(paths.path("rung_mark", step=step, **kw))]
        files += [p for p in cell_outputs(cell.id) if _step_of(p) is not None and _step_of(p) <= step]
        if fate == FAIL and cell.id in self.search.failed_at(k):  # ended (diverged): its outputs exist
            files += [p for p in cell_outputs(cell.id) if _step_of(p) is None]
        return files

    def _censored(self, name: str) -> bool:
        """A hypothesis whose setting the search stopped (or failed): no look, no seed added."""
        if self.search is None:
            return False
        h = self.study.hypotheses[name]
        sides = {self.search.setting_of[c] for _, a, b in comparison_seeds(self.study, self.table, h)
                 for c in (a, b) if c in self.search.setting_of}
        return any(self.search.fate(s)[0] != FINISH for s in sides)


_RUNGS: dict[str, list[int]] = {}  # study name -> its resolved rungs (search=off: existing_mark)


def _mark_if_there(study: Any, table: Any, results: str, cell: str, rung: int) -> str | None:
    from lorarl.io import read_json

    p = paths.path("rung_mark", results=results, study=study.name, cell=cell, step=rung)
    doc = read_json(p)
    return str(p) if isinstance(doc, dict) and doc.get("config_hash") == table.cell(cell).hash else None


def _rungs(study: Any, table: Any) -> list[int]:
    if study.name not in _RUNGS:
        _RUNGS[study.name] = list(resolved_search(study, table).rungs)
    return _RUNGS[study.name]


def existing_mark(study: Any, table: Any, results: str, cell: str, step: int) -> str | None:
    """``--config search=off``: the mark of the rung whose segment saved snapshot ``step`` when a rung job of this
    config wrote it (that snapshot's evaluation then stays as it is), else None."""
    rung = next((r for r in _rungs(study, table) if r >= step), None)
    return None if rung is None else _mark_if_there(study, table, results, cell, rung)


def last_mark(study: Any, table: Any, results: str, cell: str) -> str | None:
    """``--config search=off``: the cell's mark of its last rung on disk, the input its `train` job had under the
    search, so that switching the search off reruns no finished cell (Snakemake's input trigger)."""
    for rung in reversed(_rungs(study, table)):
        if (m := _mark_if_there(study, table, results, cell, rung)) is not None:
            return m
    return None


def _step_of(path: str) -> int | None:
    """The snapshot step of an evaluation file `<benchmark>@<step>.json(l)`, else None."""
    stem = path.rsplit("/", 1)[-1]
    if "@" not in stem:
        return None
    return int(stem.split("@", 1)[1].split(".", 1)[0])


def describe(ad: AdaptiveStudy) -> list[str]:
    """What is decided and what waits, from the files now (nothing written): the lines `snakemake -n` prints."""
    from lorarl.adaptive import ledger
    from lorarl.adaptive.hypotheses import hypothesis_state

    study, table, results = ad.study, ad.table, ad.results
    lines = []
    if ad.spec is not None:
        sp = ad.spec
        led, records = ad.ledger_now()
        lines.append(f"search {sp.rule}: rungs {', '.join(map(str, sp.rungs))} on {sp.metric} ({sp.direction}), "
                     f"eta {sp.eta}, {len(led['settings'])} settings")
        for rung in led["rungs"]:
            dec = rung["decided"]
            parts = [f"{w} {', '.join(n for n, d in dec.items() if d == what)}" for what, w in
                     (("promote", "promoted"), ("stop", "stopped (censored)"), ("fail", "failed"))
                     if any(d == what for d in dec.values())]
            wait = [n for n in rung["arrival"] if n not in dec]
            missing = [c for n in wait for c in led["settings"][n]["cells"]
                       if str(rung["step"]) not in records["values"].get(c, {})]
            if wait:
                parts.append(f"waits on {len(wait)} setting(s): " + ", ".join(wait)
                             + (f" ({len(missing)} cell(s) still to record the rung: {', '.join(missing[:6])}"
                                f"{', ...' if len(missing) > 6 else ''})" if missing else ""))
            if not rung["arrival"]:
                parts.append("no setting reaches it yet")
            lines.append(f"rung {rung['step']}: " + ("; ".join(parts) or "nothing decided"))
        steps = {c.id: c.config.train.steps for c in table.cells}
        plan = ledger.cell_plan(led, steps)
        now, full = sum(min(p["until"], steps[c]) for c, p in plan.items()), sum(steps.values())
        lines.append(f"cell-steps allowed by the decisions so far: {now} of the full grid's {full}")
    for name, h in study.hypotheses.items():
        obs = ledger.hypothesis_observations(study, table, results, h, ad.metrics[name])
        # search=off trains a stopped cell on: its hypothesis waits on it, it is not censored
        censored = ad.search is not None and ledger.hypothesis_censored(study, table, results, h)
        st = hypothesis_state(h, obs, censored=censored)
        more = f"; waits on seed {len(obs) + 1}" if st["decision"] == "undecided" and not st["pending"] else ""
        pend = "; waits on the records of its seeds" if st["pending"] else ""
        lines.append(f"hypothesis {name} ({st['kind']}): {st['decision']} after {st['seeds_used']} seed(s) "
                     f"(cap {h.max_seeds}){pend}{more}")
    return lines
