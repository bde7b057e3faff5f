"""Paper 000's with/without-KL views in the report: Fig. 3b (reward against KL, each the mean over a cell's
last 50 training steps, all of a shorter run, one point per setting) and Tables 2-4's Δ Average row (mean over ranks of
without KL − with KL); and one colour per group across every figure of the report."""

from __future__ import annotations

import copy
import inspect

import pandas as pd
import pytest

from lorarl.language.study import load_study
from tests.support.report_fixture import STUDY, make_study


def _kl_study(tmp_path):
    spec = copy.deepcopy(STUDY)
    spec["name"] = "klrep"
    spec.pop("baseline")
    spec["axes"] = {"regime": {"field": "reward.regime", "values": ["outcome"]},
                    "kl": {"field": "train.beta", "values": [0.0, 0.05]},
                    "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 16]},
                    "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}}
    return make_study(tmp_path, study=spec)


def test_delta_average_is_the_mean_over_ranks_of_without_minus_with(tmp_path):
    from lorarl.report.data import load
    from lorarl.report.fig_kl import kl_delta_table

    sp, res = _kl_study(tmp_path)
    data = load(load_study(sp), res)
    t = kl_delta_table(data)
    assert list(t["kl_term"]) == ["w/o", "w/o", "w", "w", "Δ Average (w/o − w)"]
    col = "synthetic/pass@1"
    m = data.cells.groupby(["kl", "rank"])[col].mean()
    want = sum(m[("0", r)] - m[("0.05", r)] for r in ("1", "16")) / 2
    assert t.iloc[-1][f"{col}_mean"] == pytest.approx(want)
    assert "train_min_mean" in t and t.iloc[:4]["n_seeds"].tolist() == [3, 3, 3, 3]
    (tmp_path / "plain").mkdir()
    no_axis = load(load_study(make_study(tmp_path / "plain")[0]), tmp_path / "plain" / "results")
    assert kl_delta_table(no_axis).empty  # no train.beta axis: no table


def test_reward_vs_kl_points_and_one_colour_per_group_in_every_figure(tmp_path, monkeypatch):
    from lorarl.report import build, draw
    from lorarl.report.data import load
    from lorarl.report.fig_kl import last_steps_mean

    seen: dict[str, set] = {}
    callers: dict[str, set] = {}
    real = draw.color_of

    def spy(label):
        c = real(label)
        seen.setdefault(label, set()).add(c)
        callers.setdefault(label, set()).add(inspect.stack()[1].function)
        return c

    monkeypatch.setattr(draw, "color_of", spy)
    sp, res = _kl_study(tmp_path)
    out = build(sp, res)
    df = pd.read_csv(out["reward_vs_kl"].with_suffix(".csv"), dtype={"kl": str, "rank": str})
    assert len(df) == 4 and (df["window_steps"] == 40).all() and (df["kl_metric"] == "kl_ref/k3").all()  # 40 steps
    data = load(load_study(sp), res)
    c = data.curves
    cells = data.cells[(data.cells["kl"] == "0.05") & (data.cells["rank"] == "16")]["cell"]
    kl = c[c["cell"].isin(cells)].groupby("cell")["kl_ref/k3"].mean().mean()  # 40 steps < 50: every step
    row = df[(df["kl"] == "0.05") & (df["rank"] == "16")].iloc[0]
    assert row["kl_mean"] == pytest.approx(kl)
    short = last_steps_mean(data, "reward", window=10).set_index("cell")["value"]
    one = c[c["cell"] == cells.iloc[0]]
    assert short[cells.iloc[0]] == pytest.approx(one[one["step"] > one["step"].max() - 10]["reward"].mean())
    assert "Δ Average (w/o − w)" in out["report"].read_text()
    # one colour per group: every label drawn gets one colour, in every figure that draws it
    assert seen and all(len(col) == 1 for col in seen.values())
    shared = [lab for lab, fns in callers.items() if len(fns - {"reset_palette"}) >= 3]
    assert "regime=outcome, kl=0.05, rank=16" in shared
    draw.reset_palette(load_study(sp))
    first = dict(draw._PALETTE)
    real("some other group")
    draw.reset_palette(load_study(sp))
    assert draw._PALETTE == first  # the study's groups get the same colours in every process
