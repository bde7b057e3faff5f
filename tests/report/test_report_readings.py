"""What the report's numbers and figures say: intervals stay inside a bounded metric's range (two seeds give a
t interval of mean ± 9 sd), a caption names the window a figure really averages over (a 40-step run has no
"last 50 steps"), and no two texts of a figure are drawn over each other."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pandas as pd
import pytest

from lorarl import paths
from lorarl.report import bounds, stats
from lorarl.language.study import load_study, study_cells
from tests.support.figure_layout import overlapping_texts
from tests.support.study_shapes import fake_bases, fake_results

TWIN = Path(__file__).resolve().parents[2] / "experiments" / "reward_density_cpu.yaml"  # two seeds, 3 regimes


def _spread_rewards(study, res: Path) -> None:
    """Seed 0 ends at a train reward of 0.10, seed 1 at 0.95: two seeds that disagree."""
    for cell in study_cells(study):
        f = paths.path("summary", results=res, study=study.name, cell=cell.id)
        s = json.loads(f.read_text())
        s["final_train_reward"] = 0.10 if cell.axes["seed"] == "0" else 0.95
        f.write_text(json.dumps(s))


def test_two_seed_train_reward_interval_stays_in_the_reward_range(tmp_path):
    from lorarl.report.data import load
    from lorarl.report.tables import stats_table

    study = load_study(TWIN)
    res = fake_results(study, tmp_path / "results")
    _spread_rewards(study, res)
    t = stats_table(load(study, res))
    tr = t[t["metric"] == "final_train_reward"].set_index(["regime", "rank"])
    half = stats.t_interval([0.10, 0.95])  # unclipped: [-4.9, 5.9]
    assert half.lo < -4 and half.hi > 5
    out = tr.loc["outcome"]  # 1 / 0 reward, no overlong buffer: [0, 1]
    assert (out["ci_low"] == 0.0).all() and (out["ci_high"] == 1.0).all()
    assert out["mean"].tolist() == pytest.approx([0.525] * 3) and (out["interval"] == "t over seeds").all()
    # process rewards sum step scores and distillation sums log-ratios: no range, the t interval as it is
    for regime in ("process", "distillation"):
        assert tr.loc[regime, "ci_low"].tolist() == pytest.approx([half.lo] * 3)
    # the page's time column stays >= 0 and the evaluation columns in [0, 1] (clipped like the t intervals)
    assert (t.loc[t["metric"] == "mean_step_time_s", "ci_low"].dropna() >= 0).all()
    ev = t[t["metric"].str.contains("@")]
    assert ((ev["ci_low"] >= 0) & (ev["ci_high"] <= 1)).all()


def test_reward_ranges():
    def cfg(regime="outcome", incorrect=0.0, buffer=0, factor=1.0, fields=("regime",), terms=None):
        return SimpleNamespace(reward=SimpleNamespace(regime=regime, incorrect_reward=incorrect, terms=terms,
                                                      model_fields_set=set(fields)),
                               train=SimpleNamespace(overlong_buffer=buffer, overlong_factor=factor))

    assert bounds.outcome_bounds(cfg()) == (0.0, 1.0)
    assert bounds.outcome_bounds(cfg(incorrect=-1.0, buffer=1024, factor=1.0)) == (-2.0, 1.0)  # DAPO +1/-1, shaping
    assert bounds.outcome_bounds(cfg(regime="process")) is None
    assert bounds.outcome_bounds(cfg(fields=("regime", "new_way"))) is None  # a way of paying this rule does not know
    recipe = {"correct": 2.0, "integer_answer": 0.5, "strict_format": 0.5, "soft_format": 0.5, "xml_count": 0.5}
    assert bounds.outcome_bounds(cfg(fields=("regime", "terms"), terms=recipe)) == (-math.inf, 4.0)  # paper 000's
    assert bounds.outcome_bounds(cfg(fields=("regime", "terms"))) == (0.0, 1.0)  # terms unset: the 1/0 grade
    assert bounds.reward_bounds([cfg(), cfg(incorrect=-1.0)]) == (-1.0, 1.0)
    assert bounds.reward_bounds([cfg(), cfg(regime="distillation")]) is None
    assert bounds.column_bounds("aime24/pass@32", []) == (0.0, 1.0)
    assert bounds.column_bounds("mean_step_time_s", []) == (0.0, math.inf)
    assert bounds.consistent((0.0, 1.0), [0.5, 1.7]) is None  # an observed 1.7: not this column's range
    assert stats.t_interval([0.1, 0.95], bounds=(0.0, 1.0)).lo == 0.0


def test_train_reward_band_is_clipped_per_group(tmp_path):
    """The train-reward figure's ± sd band: clipped for the outcome groups, as drawn for the others."""
    from lorarl.report.aggregate import metric_curves
    from lorarl.report.plots import reward_curves

    study = load_study(TWIN)
    res = fake_results(study, tmp_path / "results")
    seen = {}

    def band(ax, x, mean, sd, color, label, bounds=None, **line):
        seen[label] = bounds

    with mock.patch("lorarl.report.plots._band", band):
        reward_curves(study, metric_curves(study, res), tmp_path / "train_reward.png")
    assert {k: v for k, v in seen.items() if k.startswith("regime=outcome")} == {
        f"regime=outcome, rank={r}": (0.0, 1.0) for r in ("1", "16", "full")}
    assert all(v is None for k, v in seen.items() if not k.startswith("regime=outcome")) and len(seen) == 9


def test_figures_draw_no_text_over_text_and_captions_name_the_real_window(tmp_path):
    """Every figure of the rich synthetic study (tests/support/report_fixture.py, 40 training steps): no title, label or
    tick label over another (the weight-space diagnostics once printed two panel titles over each other); the
    reward-vs-KL caption and CSV say the 40 steps they average, not the paper's 50."""
    import matplotlib.figure

    from lorarl.report import build
    from lorarl.report.aggregate import aggregate
    from tests.support.report_fixture import STEPS, make_study

    sp, res = make_study(tmp_path)
    study = load_study(sp)
    fake_bases(study, res)
    overlaps: dict[str, list] = {}
    save = matplotlib.figure.Figure.savefig

    def checked(fig, fname, *args, **kw):
        save(fig, fname, *args, **kw)
        overlaps[Path(str(fname)).stem] = overlapping_texts(fig)

    with mock.patch.object(matplotlib.figure.Figure, "savefig", checked):
        aggregate(study, res)
        out = build(sp, res)
    assert len(overlaps) >= 13 and "diagnostics" in overlaps
    assert not any(overlaps.values()), {k: v for k, v in overlaps.items() if v}
    page = out["report"].read_text()
    assert STEPS < 50 and f"last {STEPS} training steps (the whole run; the paper&#x27;s window is 50)" in page
    assert "last 50" not in page
    assert (pd.read_csv(out["reward_vs_kl"].with_suffix(".csv"))["window_steps"] == STEPS).all()
