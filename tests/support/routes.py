"""One cell, many hosts in turn: record what every pack job of a test made of each cell, across jobs, as one
:class:`tests.support.solo_pack.HostRun` per cell (comparable with the solo TRL job's, tests/support/solo_pack.py).

    seen = record_packs(monkeypatch)                 # every pack built from now on (fixed, resident, a pack of one)
    train_pack("rt", cells, res, stop_at=2); train_alone("rt", cells[0], res)   # a route: paused, resumed elsewhere
    assert_same_result(train_solo(cells[0].config, ref), seen.run(cells[0].id))  # = its uninterrupted solo run

Per cell: the completion token ids its regime scored at each step (graded by solo_pack.score, as the solo harness
grades), the metrics row of each step (noise dropped), its adapter's tensors after its last step and before its
first. A step retrained after a resume would show twice: the rows and ids are appended in the order the jobs ran.
"""

from __future__ import annotations

from typing import Any

from tests.support.solo_pack import HostRun, Recorded, clean_row, recorded_regime, tensors


class Seen:
    """What the packs of this test made of each cell, by cell id."""

    def __init__(self) -> None:
        self.ids: dict[str, list] = {}
        self.rows: dict[str, list] = {}
        self.weights: dict[str, dict] = {}
        self.start: dict[str, dict] = {}

    def run(self, cell_id: str) -> HostRun:
        return HostRun(ids=self.ids[cell_id], rows=self.rows[cell_id], weights=self.weights[cell_id],
                       start=self.start[cell_id])


def record_packs(monkeypatch: Any) -> Seen:
    """From now on every pack (lorarl.pack.build.build_pack) grades with solo_pack.score and is recorded."""
    from lorarl.pack import build

    real, seen = build.build_pack, Seen()

    def built(cells: list[Any], *a: Any, **kw: Any) -> Any:
        pack = real(cells, *a, **kw)
        models = {c.id: pc.model for c, pc in zip(cells, pack.loop.trainer.cells, strict=True)}
        for c, member in zip(cells, pack.loop.members, strict=True):
            rec: Recorded = recorded_regime()
            rec.ids = seen.ids.setdefault(c.id, [])  # one list per cell across the jobs of its route
            member.regime = rec
            seen.start.setdefault(c.id, tensors(models[c.id]))  # before its first step (a fresh pack's init)
        step = pack.loop.step

        def recorded_step() -> Any:
            rows = step()
            for cid, row in rows.items():
                seen.rows.setdefault(cid, []).append(clean_row(row))
                seen.weights[cid] = tensors(models[cid])
            return rows

        pack.loop.step = recorded_step
        return pack

    monkeypatch.setattr(build, "build_pack", built)
    return seen
