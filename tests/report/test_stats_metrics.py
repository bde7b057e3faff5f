"""The stats table scores every problem by its column's metric (papers 002 and 003: Avg@k the mean
correctness of a problem's samples, pass@k "any of k correct", computed as the unbiased estimator, which is
"any of the n correct" when k = n), so its means, intervals and differences to the baseline are on the
column's metric, not on every column's mean correctness. One fixture: two groups x two seeds, four
problems, four samples each, with known per-problem correct counts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from lorarl import paths
from lorarl.report import stats
from lorarl.report.data import score_problems
from lorarl.report.tables import stats_markdown, stats_table

BENCH = "aime24"
SAMPLES = {  # cell -> per problem p0..p3: its 4 samples, 1 = correct
    "r16-s0": ["1000", "1100", "0000", "1111"],  # correct counts 1 2 0 4
    "r16-s1": ["1110", "0000", "0100", "1111"],  # 3 0 1 4
    "full-s0": ["0000", "1000", "0000", "1110"],  # 0 1 0 3
    "full-s1": ["1000", "0000", "0000", "1100"],  # 1 0 0 2
}
# metric -> per-problem score of a problem with c = 0..4 correct of its n = 4 samples (written out, not computed
# with the estimator under test): avg@4 = c/4; pass@4 = any correct; pass@2 = 1 - C(4-c, 2)/C(4, 2)
BY_CORRECT = {
    "avg@4": [0, 1 / 4, 2 / 4, 3 / 4, 1],
    "pass@4": [0, 1, 1, 1, 1],
    "pass@2": [0, 1 - 3 / 6, 1 - 1 / 6, 1, 1],
    "pass@1": [0, 1 / 4, 2 / 4, 3 / 4, 1],
}


def _correct(cell: str) -> list[int]:
    return [s.count("1") for s in SAMPLES[cell]]


def _expected(cell: str, metric: str) -> np.ndarray:
    return np.array([BY_CORRECT[metric][c] for c in _correct(cell)], dtype=float)


def _fixture(tmp: Path) -> SimpleNamespace:
    rows = []
    for cell, problems in SAMPLES.items():
        f = paths.path("eval_samples", results=tmp, study="st", cell=cell, benchmark=BENCH)
        f.parent.mkdir(parents=True, exist_ok=True)
        lines = [{"problem_id": f"p{i}", "sample": j, "correct": ch == "1"}
                 for j in range(4) for i, s in enumerate(problems) for ch in s[j]]  # sample-major order
        f.write_text("".join(json.dumps(x) + "\n" for x in lines))
        rank, seed = cell.split("-")
        # the cell table's values: the mean over problems of each metric's per-problem scores (the summary's)
        rows.append({"cell": cell, "rank": rank, "seed": seed,
                     **{f"{BENCH}/{m}": float(_expected(cell, m).mean()) for m in BY_CORRECT}})
    study = SimpleNamespace(name="st", baseline={"rank": "full"}, axes={"rank": None, "seed": None}, seed_axis="seed")
    return SimpleNamespace(study=study, results=tmp, cells=pd.DataFrame(rows), keys=["rank"],
                           censored=pd.DataFrame())  # no adaptive search: nothing censored


@pytest.mark.parametrize("metric", ["pass@4", "pass@2", "avg@4", "pass@1"])
def test_stats_table_scores_problems_by_the_headline_metric(tmp_path, metric):
    data = _fixture(tmp_path)
    with mock.patch("lorarl.report.columns.headlines", return_value={BENCH: metric}):
        t = stats_table(data)
        md = stats_markdown(data, t)
    col = f"{BENCH}/{metric}"
    row, base = (t[(t["metric"] == col) & (t["rank"] == r)].iloc[0] for r in ("r16", "full"))
    exp = {r: np.stack([_expected(f"{r}-s{s}", metric) for s in (0, 1)]) for r in ("r16", "full")}
    assert row["interval"] == "seeds x problems" and row["n_problems"] == 4 and row["n_seeds"] == 2
    # the printed value is the column's metric (the mean over seeds of the cell table's values) ...
    assert row["mean"] == pytest.approx(exp["r16"].mean())
    assert row["mean"] == pytest.approx(data.cells.loc[data.cells["rank"] == "r16", col].mean())
    assert base["mean"] == pytest.approx(exp["full"].mean())
    # ... its sd over seeds, interval and the difference to the baseline resample those per-problem scores
    e_row, e_base = stats.two_level(exp["r16"], seeds=("0", "1")), stats.two_level(exp["full"], seeds=("0", "1"))
    cmp = stats.compare(e_row, e_base)
    assert row["paired_on"] == cmp.pairing == "seeds and problems"
    assert row["sd"] == pytest.approx(e_row.sd)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((max(e_row.lo, 0.0), min(e_row.hi, 1.0)))
    assert row["diff"] == pytest.approx(exp["r16"].mean() - exp["full"].mean())
    assert (row["diff_low"], row["diff_high"], row["mde"]) == pytest.approx((cmp.lo, cmp.hi, cmp.mde))
    assert row["resolvable"] == cmp.resolvable
    assert f"{row['mean']:.3f}" in md and col.replace("/", " ") in md


def test_known_values_of_the_fixture():
    """The expectations above, by hand: r16 vs full on pass@4, pass@2 and avg@4 differ from one another."""
    means = {m: (np.mean([_expected(f"r16-s{s}", m) for s in (0, 1)]),
                 np.mean([_expected(f"full-s{s}", m) for s in (0, 1)])) for m in BY_CORRECT}
    assert means["pass@4"] == pytest.approx((6 / 8, 4 / 8))
    assert means["pass@2"] == pytest.approx(((1 / 2 + 5 / 6 + 0 + 1 + 1 + 0 + 1 / 2 + 1) / 8,
                                             (0 + 1 / 2 + 0 + 1 + 1 / 2 + 0 + 0 + 5 / 6) / 8))
    assert means["avg@4"] == pytest.approx((15 / 32, 7 / 32))


def test_score_problems_errors_name_the_metric():
    counts = pd.DataFrame({"n": [4, 2], "c": [1, 2]}, index=["p0", "p1"])
    assert score_problems(counts, "pass@2").tolist() == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError, match=r"metric 'pass@4' of samples: 1 problems have fewer than 4 samples "
                                         r"\(e.g. 'p1' has 2\); allowed: pass@k with k <= n"):
        score_problems(counts, "pass@4")
    with pytest.raises(ValueError, match=r"metric 'mean@4' of samples: allowed: avg@<k>, pass@<k>"):
        score_problems(counts, "mean@4")
