"""Censored cells in every table (docs/adaptive.md): a study whose search stopped half its settings at a rung
(synthetic records, tests/support/adaptive_results.py; the real decision function) has, in cells.csv, the summary table,
the stats table and report.html, a row for every setting, the stopped ones censored at their rung (never
failed, never a zero), and `lorarl status` says `stopped`; the rung plot and the search/hypotheses tables are
drawn; a cell stopped and later trained to its end is an ordinary finished cell."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tests.support.adaptive_results import STUDY, adaptive_results


def stopped_study(tmp_path: Path):
    f, study, table, res = adaptive_results(tmp_path, STUDY)
    led = json.loads((res / "adr" / "adaptive" / "search.json").read_text())
    stopped = [c for n, st in led["state"].items() if st["state"] == "stopped" for c in led["settings"][n]["cells"]]
    assert sorted(stopped) == ["r1-s0", "r1-s1", "r2-s0", "r2-s1"]
    return f, study, table, res


def test_censored_cells_in_every_table(tmp_path):
    from lorarl.status import format_table, study_status
    from lorarl.report import build
    from lorarl.report.aggregate import aggregate

    f, study, table, res = stopped_study(tmp_path)
    aggregate(study, res)
    out = build(f, res)
    tdir = res / "adr" / "tables"
    cells = pd.read_csv(tdir / "cells.csv")
    stopped = cells[cells["state"] == "stopped"]
    assert sorted(stopped["cell"]) == ["r1-s0", "r1-s1", "r2-s0", "r2-s1"]
    assert (stopped["stopped_at_step"] == 2).all() and stopped["synthetic/pass@1"].isna().all()  # unobserved
    summary = pd.read_csv(tdir / "summary.csv", dtype={"rank": str})
    assert summary["rank"].tolist() == ["1", "2", "4", "8"]  # every setting, in the study's order
    assert summary["n_seeds"].tolist() == [0, 0, 2, 2] and summary["n_stopped"].tolist() == [2, 2, 0, 0]
    assert summary["synthetic/pass@1_mean"].isna().tolist() == [True, True, False, False]
    md = (tdir / "summary.md").read_text()
    assert md.count("(2 stopped at step 2: censored)") == 2 and "diverged" not in md and "failed" not in md
    st = pd.read_csv(tdir / "stats.csv", dtype={"rank": str})
    cen = st[st["interval"] == "censored"]
    assert sorted(cen["rank"]) == ["1", "2"] and (cen["censored_at_step"] == 2).all() and cen["mean"].isna().all()
    assert st["rank"].drop_duplicates().tolist() == ["1", "2", "4", "8"]
    stats_md = (tdir / "stats.md").read_text()
    assert stats_md.count("censored at step 2 (stopped by the search; 2 cells)") == 2
    page = out["report"].read_text()
    assert page.count("censored at step 2") >= 2 and "search_rungs" in page and "hypotheses:" in page
    rungs = pd.read_csv(res / "adr" / "figures" / "search_rungs.csv")
    assert set(rungs[rungs["step"] == 2]["decision"]) == {"promote", "stop"}
    assert set(rungs[rungs["decision"] == "final"]["setting"]) == {"rank=4", "rank=8"}
    search = pd.read_csv(tdir / "search.csv", dtype={"rank": str})
    assert search.set_index("rank").loc["1", "state"] == "stopped"
    assert search.set_index("rank").loc["all", "cell_steps"] == 4 * 2 + 4 * 6  # 4 cells to step 2, 4 to step 6
    assert search.set_index("rank").loc["all", "fixed_cell_steps"] == 8 * 6
    hyp = pd.read_csv(tdir / "hypotheses.csv")
    assert hyp["hypothesis"].tolist() == ["top"] and hyp["max_seeds"].tolist() == [2]
    assert hyp["cell_steps"].tolist() == [24] and hyp["fixed_cell_steps"].tolist() == [24]
    rows = {r.cell: r for r in study_status(f, res)}
    assert rows["r1-s0"].train.state == "stopped" and rows["r1-s0"].train.step == "2/6"
    assert "censored at step 2" in rows["r1-s0"].train.detail and rows["r4-s0"].train.state == "done"
    assert "4 stopped" in format_table(list(rows.values()))


def test_a_stopped_cell_trained_on_is_finished_again(tmp_path):
    """`--config search=off` (or a later promotion) trains a stopped cell to its end: it is no longer censored."""
    from lorarl.report.aggregate import cell_table as cells_of
    from tests.support.study_shapes import fake_results as refill

    f, study, table, res = stopped_study(tmp_path)
    refill(study, res, seed=3)  # every cell finished, as after search=off
    cells = cells_of(study, res)
    assert "stopped" not in set(cells["state"]) and cells["synthetic/pass@1"].notna().all()
