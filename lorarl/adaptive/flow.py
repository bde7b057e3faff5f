"""What the workflow may run, read off the decisions (pure: the workflow hands in how to read them).

The workflow (workflow/rules/adaptive.smk) makes every decision a Snakemake **checkpoint** job whose output,
a *view*, holds the decisions of one rung (``results/<study>/adaptive/<tag>/rung-<step>-<n>.json``) or one
hypothesis look (``.../<hypothesis>-<n>.json``). Input functions ask these classes what to run; a class asks
``get`` for the views it needs, and ``get`` raises Snakemake's ``IncompleteCheckpointException`` while a view
is not written yet: Snakemake then runs the checkpoint (whose inputs are the records it decides from) and asks
again. So the DAG grows only as far as the decisions allow.

Search views, per rung ``k`` (of ``rungs``): ``n = "all"``, the whole rung, once every setting that reaches
it is known (rung k-1's ``all`` view) and has recorded it; and, under ``asha``, ``n = eta, eta+1, ...``: once
the first ``n`` settings of its arrival order have recorded it (what asynchronous promotion needs). A view is
the ledger's rung section at the time the checkpoint ran (lorarl.adaptive.halving.decide): it may hold more
decisions than its prefix needs, never other ones (decisions are a pure function of the records and are never
taken back), so whichever view a decision is read from, it is the same decision.

Hypothesis looks: look ``n`` holds the state after the first ``n`` seeds of the comparison (its records as
inputs); a look that leaves the comparison undecided below its cap asks for the next seed's cells.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from lorarl import paths
from lorarl.adaptive.halving import FAIL, PROMOTE, STOP
from lorarl.adaptive.hypotheses import UNDECIDED

__all__ = ["FlowError", "SearchFlow", "HypothesisFlow", "FINISH", "ALL"]

FINISH = "finish"  # a cell's fate: promoted at every rung, trains to its last step
ALL = "all"  # the view of a whole rung


class FlowError(RuntimeError):
    """A file asked for that the decisions do not allow (e.g. the next segment of a stopped cell)."""


class SearchFlow:
    """A study's successive halving as the workflow sees it: each setting's fate, read rung by rung."""

    def __init__(self, spec: Any, settings: Sequence[Any], get: Callable[[int, Any], dict]):
        """``spec``: the resolved `search:` block (dict or model); ``settings``: lorarl.language.adaptive.settings.Setting
        in arrival order; ``get(step, n)``: the view of rung ``step`` after ``n`` settings (or ``"all"``)."""
        sp = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)
        self.rule, self.rungs, self.eta = sp.get("rule", "sha"), [int(r) for r in sp["rungs"]], int(sp["eta"])
        self.names = [s.name for s in settings]
        self.cells = {s.name: list(s.cells) for s in settings}
        self.setting_of = {c: s.name for s in settings for c in s.cells}
        self._get, self._views = get, {}

    # ---- views -----------------------------------------------------------------------------------
    def view(self, k: int, n: Any) -> dict:
        if (k, n) not in self._views:
            self._views[(k, n)] = self._get(self.rungs[k], n)  # raises while the checkpoint has not run
        return self._views[(k, n)]

    def views(self, k: int, start: int = 0) -> Iterator[dict]:
        """Rung k's views in the order decisions arrive: asha's prefixes (from ``start``), then the whole rung."""
        if self.rule == "asha":
            n = max(self.eta, start)
            while self.arrival(k, n) is not None:
                yield self.view(k, n)
                n += 1
        yield self.view(k, ALL)

    def arrival(self, k: int, n: Any) -> list[str] | None:
        """The first ``n`` settings (``"all"``: every one) to reach rung k; None when fewer reach it."""
        if k == 0:
            order = self.names
        elif n == ALL:
            order = self.view(k - 1, ALL)["promoted"]
        else:
            order = next((v["promoted"] for v in self.views(k - 1) if len(v["promoted"]) >= n), None)
            if order is None:
                return None
        if n == ALL:
            return list(order)
        return list(order[:n]) if n <= len(order) else None

    def decision(self, name: str, k: int) -> str:
        """``promote`` | ``stop`` | ``fail`` of a setting that reached rung k."""
        start = 0
        if self.rule == "asha":  # its place in the arrival order: no view of a shorter prefix is needed
            order = self.names if k == 0 else next(v["promoted"] for v in self.views(k - 1) if name in v["promoted"])
            start = order.index(name) + 1
        for v in self.views(k, start):
            if name in v["decided"]:
                return v["decided"][name]
        raise FlowError(f"rung {self.rungs[k]}: the whole rung's view does not decide setting {name!r} "
                        "(a record deleted after the decision? remove the view to decide again)")

    def fate(self, name: str) -> tuple[str, int]:
        """(``finish``, len(rungs)) or (``stop`` | ``fail``, the rung index where it ended)."""
        for k in range(len(self.rungs)):
            d = self.decision(name, k)
            if d != PROMOTE:
                return d, k
        return FINISH, len(self.rungs)

    def _reached(self, cell: str, k: int) -> str:
        """The setting of ``cell``, checked to be promoted at every rung before k."""
        name = self.setting_of[cell]
        for j in range(k):
            d = self.decision(name, j)
            if d != PROMOTE:
                raise FlowError(f"cell {cell}: its setting {name} was {'stopped' if d == STOP else 'failed'} at "
                                f"step {self.rungs[j]}; it does not train to step {self.rungs[k] if k < len(self.rungs) else 'end'}")
        return name

    # ---- what each rule needs --------------------------------------------------------------------
    def mark(self, results: str, study: str, cell: str, k: int) -> str:
        return str(paths.path("rung_mark", results=results, study=study, cell=cell, step=self.rungs[k]))

    def segment_inputs(self, results: str, study: str, cell: str, step: int) -> list[str]:
        """Train ``cell`` up to rung ``step``: the previous rung's mark, once its setting was promoted there."""
        k = self.rungs.index(step)
        self._reached(cell, k)
        return [self.mark(results, study, cell, k - 1)] if k else []

    def final_inputs(self, results: str, study: str, cell: str, failed: bool = False) -> list[str]:
        """Train ``cell`` to its end: promoted at the last rung (or, ``failed``, the rung where it ended)."""
        if cell not in self.setting_of:
            return []  # a cell outside the search (a seed a hypothesis added): trains straight through
        fate, k = self.fate(self.setting_of[cell])
        if fate == FINISH:
            return [self.mark(results, study, cell, k - 1)]
        if fate == FAIL and cell in self.failed_at(k):
            return [self.mark(results, study, cell, k)]
        raise FlowError(f"cell {cell}: stopped at step {self.rungs[k]} by the search; it is not trained to its end")

    def step_eval_inputs(self, results: str, study: str, cell: str, step: int) -> list[str] | None:
        """A snapshot evaluation at ``step``: the mark of the rung whose segment saved it (None: a step past the
        last rung, evaluated once the cell finished; or a cell outside the search)."""
        if cell not in self.setting_of:
            return None
        k = next((i for i, r in enumerate(self.rungs) if r >= step), None)
        if k is None:
            return None
        self._reached(cell, k)
        return [self.mark(results, study, cell, k)]

    def view_cells(self, k: int, n: Any) -> list[str]:
        """The cells whose rung-k records a view decides from (the first n settings of its arrival order)."""
        order = self.arrival(k, n)
        if order is None:
            raise FlowError(f"rung {self.rungs[k]}: fewer than {n} settings reach it")
        return [c for name in order for c in self.cells[name]]

    def failed_at(self, k: int) -> dict[str, int]:
        """Cells that failed (summary.json diverged/failed) by rung k, as its whole view read them."""
        return dict(self.view(k, ALL).get("failed", {}))


class HypothesisFlow:
    """One hypothesis's looks: the seeds (and so the cells) it uses, read look by look."""

    def __init__(self, spec: Any, seeds: Sequence[tuple[str, str, str]], get: Callable[[int], dict]):
        """``seeds``: (seed label, cell of a, cell of b) in seed order up to the cap; ``get(n)``: look n's view."""
        sp = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)
        self.min, self.max = int(sp["min_seeds"]), int(sp["max_seeds"])
        self.seeds = list(seeds)[: self.max]
        self._get = get

    def look_cells(self, n: int) -> list[str]:
        """The cells look n reads (both settings, the first n seeds)."""
        if n > len(self.seeds):
            raise FlowError(f"look {n}: the comparison has {len(self.seeds)} seeds at most")
        return [c for _, a, b in self.seeds[:n] for c in (a, b)]

    def last_look(self) -> int:
        """The look the comparison ends at: decided, inconclusive, or the cap (raises while one is pending)."""
        n = min(self.min, len(self.seeds))
        while True:
            v = self._get(n)
            if v["decision"] != UNDECIDED or n >= len(self.seeds):
                return n
            n += 1

    def used_cells(self) -> list[str]:
        return self.look_cells(self.last_look())
