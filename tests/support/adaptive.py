"""Synthetic rungs for the adaptive decisions: a grid of settings, records and a search block."""

from __future__ import annotations

from types import SimpleNamespace

from lorarl.language.adaptive.settings import group
from lorarl.language.adaptive.blocks import SearchSpec


def grid(ranks=("1", "2", "4", "8"), seeds=("0", "1")):
    cells = [SimpleNamespace(id=f"r{r}-s{s}", axes={"rank": r, "seed": s}) for r in ranks for s in seeds]
    return group(cells, ["rank", "seed"], ["seed"])


def spec(**kw):
    return SearchSpec(**{"rule": "sha", "rungs": [10, 20], "metric": "synthetic/pass@1", "eta": 2,
                         "paired": ["seed"], **kw})


def recs(table: dict[str, dict[int, float]], failed: dict[str, int] | None = None) -> dict:
    return {"values": {c: {str(k): v for k, v in vs.items()} for c, vs in table.items()}, "failed": failed or {}}
