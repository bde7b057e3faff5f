"""A study whose hypothesis adds seeds aggregates and reports (docs/adaptive.md): the added-seed cells are in
every table, figure, status line and count, and in the cell-steps spent (synthetic records,
tests/support/adaptive_results.py; the real decision function)."""

from __future__ import annotations

import copy

import pandas as pd

from tests.support.adaptive_results import STUDY as BASE
from tests.support.adaptive_results import adaptive_results

STUDY = copy.deepcopy(BASE)
STUDY["hypotheses"]["top"]["max_seeds"] = 3  # seed 2 of ranks 4 and 8 is added


def test_added_seed_cells_in_every_table(tmp_path):
    from lorarl.report import build
    from lorarl.report.aggregate import aggregate
    from lorarl.status import format_table, study_status

    f, study, table, res = adaptive_results(tmp_path, STUDY, added=True)
    assert [c.id for c in table.extra_cells()] == ["r4-s2", "r8-s2"]
    aggregate(study, res)
    out = build(f, res)
    tdir = res / "adr" / "tables"
    cells = pd.read_csv(tdir / "cells.csv")
    assert {"r4-s2", "r8-s2"} <= set(cells["cell"])
    summary = pd.read_csv(tdir / "summary.csv", dtype={"rank": str}).set_index("rank")
    assert summary.loc["4", "n_seeds"] == 3 and summary.loc["8", "n_seeds"] == 3
    rewards = pd.read_csv(res / "adr" / "figures" / "train_reward.csv", dtype={"rank": str})
    assert set(rewards["rank"]) == {"4", "8"}
    page = out["report"].read_text()
    assert "r4-s2" in page and "r8-s2" in page  # the status table lists the added seeds
    rows = {r.cell: r for r in study_status(f, res)}
    assert rows["r4-s2"].train.state == "done" and rows["r8-s2"].train.state == "done"
    assert "6 done" in format_table(list(rows.values()))
    search = pd.read_csv(tdir / "search.csv", dtype={"rank": str}).set_index("rank")
    assert search.loc["4", "cell_steps"] == 3 * 6 and search.loc["all", "cell_steps"] == 4 * 2 + 6 * 6
    assert search.loc["4", "n_cells"] == 3 and search.loc["all", "fixed_cell_steps"] == 10 * 6
    assert search.loc["4", "state"] == "finished" and search.loc["1", "state"] == "stopped"
    peak = pd.read_csv(tdir / "peak_final.csv", dtype={"rank": str}).set_index("rank")
    assert peak.loc[["1", "2"], "final_mean"].isna().all()  # stopped at step 2: no final, never the rung's value
    assert peak.loc[["1", "2"], "peak_step_mean"].eq(2).all() and peak.loc[["4", "8"], "final_mean"].notna().all()
    rungs = pd.read_csv(res / "adr" / "figures" / "search_rungs.csv")
    end = rungs[(rungs["decision"] == "final") & (rungs["setting"] == "rank=4")]["value"]
    by_cell = cells.set_index("cell")["synthetic/pass@1"]
    assert end.tolist() == [by_cell[["r4-s0", "r4-s1"]].mean()]  # the rung points' seeds, not the added one
    assert by_cell[["r4-s0", "r4-s1"]].mean() != by_cell[["r4-s0", "r4-s1", "r4-s2"]].mean()


def test_a_tie_decided_by_the_hash_is_flagged_in_search_csv(tmp_path):
    from lorarl.report.adaptive import search_table

    level = {"1": 0.1, "2": 0.5, "4": 0.5, "8": 0.9}  # ranks 2 and 4 tie at the keep line (2 of 4 kept)
    f, study, table, res = adaptive_results(tmp_path, STUDY, value=lambda c: level[c.axes["rank"]])
    search = search_table(study, table, res).set_index("rank")
    assert search.loc["2", "hash_ties"] == "2" and search.loc["4", "hash_ties"] == "2"
    assert pd.isna(search.loc["1", "hash_ties"]) and pd.isna(search.loc["8", "hash_ties"])
    assert sorted(search.loc[["2", "4"], "state"]) == ["finished", "stopped"]
