"""Collapse flags, honest statistics, the figure registry and report.html on a synthetic study."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from lorarl.train import flags
from lorarl.report import stats
from lorarl.language.study import StudyError, load_study
from tests.support.report_canvas import capture, captions, no_reprs, outside
from tests.support.cost import make_record, put
from tests.support.report_fixture import STUDY, make_study, trace


# ----------------------------------------------------------------------------- flags
def test_flags_fire_on_a_collapsing_trace_and_not_on_a_stable_one():
    bad = flags.detect(trace(True, 0).to_dict("records"))
    assert bad == {"adv_std_spike": 15, "truncation_saturation": 19, "reward_collapse": bad["reward_collapse"]}
    assert 22 <= bad["reward_collapse"] <= 30  # after the peak at step ~20, before the floor
    assert bad["adv_std_spike"] < bad["reward_collapse"]  # the spike comes first (paper 001)
    for seed in range(5):
        assert flags.detect(trace(False, seed).to_dict("records")) == {}


def test_flags_need_history_and_a_real_rise():
    rows = [{"step": i, "adv/std": 5.0, "reward": 0.5} for i in range(1, 30)]  # high from the start: no spike
    assert flags.detect(rows) == {}
    flat_then_dip = [{"step": i, "reward": 0.5 if i < 15 else 0.45} for i in range(1, 30)]
    assert "reward_collapse" not in flags.detect(flat_then_dip)  # never climbed: not a collapse
    assert flags.mlflow_tags({"adv_std_spike": 7}) == {"flag.adv_std_spike": "7", "lorarl.train.flags": "adv_std_spike"}


def test_collapse_monitor_stops_training_at_the_first_flag():
    class Rec:
        rows: list = []

    class Ctl:
        should_training_stop = False

    class State:
        global_step = 0

    rec, ctl, state = Rec(), Ctl(), State()
    mon = flags.monitor(rec, stop=True)
    for row in trace(True, 0).to_dict("records"):
        rec.rows.append(row)
        state.global_step = int(row["step"])
        mon.on_log(None, state, ctl, logs={"loss": 0.0})
        if ctl.should_training_stop:
            break
    assert mon.stopped_at == 15 and mon.flags == {"adv_std_spike": 15}


# ----------------------------------------------------------------------------- statistics
def test_two_level_interval_accounts_for_problems_and_seeds():
    rng = np.random.default_rng(0)
    small = (rng.random((3, 50)) < 0.5).astype(float)
    large = (rng.random((3, 2000)) < 0.5).astype(float)
    e_small, e_large = stats.two_level(small), stats.two_level(large)
    assert e_small.lo < e_small.mean < e_small.hi
    assert (e_small.hi - e_small.lo) > 2.5 * (e_large.hi - e_large.lo)  # ~sqrt(40) narrower
    # same problems, seeds that disagree a lot: the interval widens with the seed spread
    spread = np.stack([(rng.random(2000) < p).astype(float) for p in (0.2, 0.5, 0.8)])
    e_spread = stats.two_level(spread)
    assert (e_spread.hi - e_spread.lo) > 3 * (e_large.hi - e_large.lo)
    # the seeds' part is a t with S - 1 df: with seeds alone differing, the half-width is t_{0.975, 2} x sd/sqrt(3)
    per_seed = spread.mean(axis=1)
    half = (e_spread.hi - e_spread.lo) / 2
    assert half >= 4.30 * per_seed.std(ddof=1) / np.sqrt(3) - 1e-12
    one = stats.two_level(spread[:1])  # one seed: the problems' part only
    assert np.isnan(one.sd) and one.lo < one.mean < one.hi


def test_comparison_resolvable_and_mde():
    rng = np.random.default_rng(1)
    base = stats.two_level((rng.random((3, 100)) < 0.5).astype(float), seeds=(0, 1, 2))
    same = stats.two_level((rng.random((3, 100)) < 0.5).astype(float), seeds=(0, 1, 2))
    far = stats.two_level((rng.random((3, 100)) < 0.9).astype(float), seeds=(0, 1, 2))
    c_same, c_far = stats.compare(same, base), stats.compare(far, base)
    assert c_same.pairing == c_far.pairing == "seeds and problems"
    assert not c_same.resolvable and c_far.resolvable
    assert 0.05 < c_same.mde < 0.6  # 100 problems x 3 seeds, the seed part at 2 df: ~0.2-0.4
    txt = stats.fmt_comparison(c_same, "full")
    assert re.fullmatch(r"vs full: [+−]0\.\d{3}, not resolvable \(MDE 0\.\d\d\)", txt), txt
    other = stats.two_level(far.scores_SP, seeds=(5, 6, 7))  # other seeds: unpaired, and said so
    c = stats.compare(other, base)
    assert c.pairing == "problems" and c.diff == pytest.approx(c_far.diff)
    assert stats.fmt_comparison(c, "full").endswith(", seeds unpaired)")


def test_pairing_by_seed_uses_the_seed_labels_not_the_order():
    """Common random numbers: seed s of a row is compared with seed s of its baseline, whatever the row order;
    a shared seed effect then cancels, and the paired interval is narrower than the unpaired one."""
    rng = np.random.default_rng(3)
    shift_S = np.array([0.0, 0.3, -0.3])[:, None]  # each seed's own level, shared by both rows
    base_SP = np.clip(0.5 + shift_S + rng.normal(0, 0.05, (3, 200)), 0, 1)
    row_SP = np.clip(0.55 + shift_S + rng.normal(0, 0.05, (3, 200)), 0, 1)
    base = stats.two_level(base_SP, seeds=("s0", "s1", "s2"))
    row = stats.two_level(row_SP[[2, 0, 1]], seeds=("s2", "s0", "s1"))  # the same cells, another order
    paired = stats.compare(row, base)
    assert paired.pairing == "seeds and problems" and paired.resolvable
    unpaired = stats.compare(stats.two_level(row_SP, seeds=("s3", "s4", "s5")), base)
    assert unpaired.pairing == "problems" and not unpaired.resolvable
    assert (paired.hi - paired.lo) < 0.2 * (unpaired.hi - unpaired.lo)


def test_stats_table_rows_read_like_the_issue(tmp_path):
    from lorarl.report.data import load
    from lorarl.report.tables import stats_markdown, stats_table

    sp, res = make_study(tmp_path)
    data = load(load_study(sp), res)
    t = stats_table(data)
    row = t[(t["regime"] == "outcome") & (t["rank"] == "1") & (t["metric"] == "synthetic/pass@1")].iloc[0]
    assert re.fullmatch(r"0\.\d{3} ± 0\.\d{3} \[0\.\d\d, 0\.\d\d\]  vs full: [+−]0\.\d{3}, "
                        r"(not )?resolvable \(MDE 0\.\d\d\)", row["text"]), row["text"]
    assert row["ci_low"] < row["mean"] < row["ci_high"] and row["n_problems"] == 100 and row["n_seeds"] == 3
    assert row["interval"] == "seeds x problems" and row["paired_on"] == "seeds and problems"
    full = t[(t["rank"] == "full") & (t["metric"] == "synthetic/pass@1")]
    assert full["text"].str.endswith("(baseline)").all()
    # process (pass@1 ≈ 0.05) vs outcome (≈ 0.55) is not a declared comparison: rows compare within a regime
    assert set(t.dropna(subset=["diff"])["rank"]) == {"1", "16"}
    md = stats_markdown(data, t)
    assert "two-level t interval over seeds and evaluation problems" in md and "| regime | rank |" in md
    # train reward: t interval over seeds
    tr = t[t["metric"] == "final_train_reward"].iloc[0]
    assert tr["interval"] == "t over seeds" and tr["ci_low"] < tr["mean"] < tr["ci_high"]


def test_study_baseline_is_validated(tmp_path):
    for bad, msg in (({"rnk": "full"}, "baseline names axis 'rnk'; allowed: regime, rank"),
                     ({"rank": "huge"}, "baseline.rank='huge' is not a value of that axis; allowed: 1, 16, full")):
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump({**STUDY, "baseline": bad}, sort_keys=False))
        with pytest.raises(StudyError, match=re.escape(msg)):
            load_study(p)
        proc = subprocess.run([sys.executable, "-m", "lorarl.cli", "report", str(p), "--results",
                               str(tmp_path / "r")], capture_output=True, text=True)
        assert proc.returncode == 2 and "baseline" in proc.stderr
        assert not (tmp_path / "r").exists()  # nothing written


# ----------------------------------------------------------------------------- figures + page
def test_registry_draws_every_headline_figure_with_its_csv(tmp_path, monkeypatch):
    from lorarl.report import build
    from lorarl.report.registry import REGISTRY

    sp, res = make_study(tmp_path)
    drawn = capture(monkeypatch)
    out = build(sp, res)
    # what a reader sees: no label or legend cut at the canvas, captions in the study's axes, no Python repr
    assert {name: b for name, fig in drawn.items() if (b := outside(fig))} == {}
    assert any("per reward regime" in c for c in captions(out["report"].read_text()))
    assert no_reprs(out["report"].read_text()) == [] and "baseline: rank = full" in out["report"].read_text()
    assert set(REGISTRY) == {"kl_vs_rank", "pass1_vs_rank_fullft", "collapse_truncation", "adv_std_peak",
                             "accuracy_vs_params", "training_dynamics", "update_sparsity", "update_views", "reward_vs_kl",
                             "subspace_similarity", "heldout_by_regime", "heldout_vs_baseline", "search_rungs"}
    assert "search_rungs" not in out  # an adaptive study's figure (tests/report/test_adaptive_report.py): none here
    for name in set(REGISTRY) - {"search_rungs"}:
        assert out[name].stat().st_size > 5000, name
        assert not pd.read_csv(out[name].with_suffix(".csv")).empty, name
    peak = pd.read_csv(out["adv_std_peak"].with_suffix(".csv")).set_index("regime")
    assert peak.loc["process", "mean"] > 8 and peak.loc["outcome", "mean"] < 1.2  # paper 001 Fig. 4's shape
    pf = pd.read_csv(out["peak_final"])
    proc = pf[(pf["regime"] == "process")]
    assert (proc["peak_step_mean"] <= 20).all() and (proc["drop"] > 0.2).all()  # Table 3: peak ≠ final
    views = pd.read_csv(out["update_views"].with_suffix(".csv"))
    assert {"update_p", "product_update_cum_energy"} <= set(views["metric"])  # both views, labelled apart
    rt = pd.read_csv(out["runtime"])
    assert {"step_s_mean", "train_min_mean", "kl_monitor_s_total_s"} <= set(rt.columns)
    page = out["report"].read_text()
    assert page.count("data:image/png;base64,") == len(list((res / "rep" / "figures").glob("*.png")))
    assert not re.search(r"""(src|href)=["']?(https?:)?//(?!127\.0\.0\.1)""", page)  # nothing fetched
    assert "adv_std_spike@15" in page and "run0000a" in page and "git.sha" in page


def test_partial_study_report_shows_what_is_done(tmp_path):
    from lorarl.report import build

    (tmp_path / "none").mkdir()
    sp, res = make_study(tmp_path / "none", done=set())  # nothing finished yet: a page all the same
    out = build(sp, res)
    assert "(no finished cells yet)" in out["stats_md"].read_text() and "<b>18</b> not started" in \
        out["report"].read_text()
    assert "no job cost record yet" in out["report"].read_text() and "cost" not in out
    sp, res = make_study(tmp_path, done={"outcome-r1-s0", "outcome-r1-s1", "process-r1-s0"})
    put(res, "rep", "outcome-r1-s0", make_record("train", "outcome-r1-s0", wall=7200, gpus=1, steps=40,
                                                 phases={"startup": 720, "generation": 3600, "update": 2160}))
    out = build(sp, res, price=3.0)  # the cost section: the jobs' records rolled up (tests/report/test_report_cost.py)
    page = out["report"].read_text()
    assert '<h2 id="cost">Cost</h2>' in page and "<b>2 GPU-hours</b>" in page and "cost 6 at 3 per GPU-hour" in page
    assert "GPU-hours by phase" in page and "GPU-hours by stage" in page and "idle share 10.0%" in page
    assert pd.read_csv(out["cost"]).set_index("level").loc["study", "cost"] == 6.0
    assert "cells finished</th><td>3 / 18" in page
    assert "<b>15</b> not started" in page
    t = pd.read_csv(out["stats_csv"])
    assert set(t["rank"].astype(str)) == {"1"} and "diff" not in t  # no baseline row finished yet
    assert out["adv_std_peak"].exists()
    assert "pass1_vs_rank_fullft" not in out  # no full fine-tuning row: not drawn (a full study draws it: the registry test)


def test_report_renders_in_headless_chromium(tmp_path):
    """Debian's chromium (scripts/chromium.sh installs it) loads report.html from disk: every figure
    decoded (naturalWidth > 0), no console error, nothing requested but the file itself."""
    from lorarl.report import build
    from tests.support.cdp import chromium, load_page

    binary = chromium()
    if binary is None:
        pytest.skip("chromium not installed (scripts/chromium.sh installs it; scripts/test.sh runs that)")
    sp, res = make_study(tmp_path)
    out = build(sp, res)
    seen = load_page(out["report"], binary)
    n_png = len(list((res / "rep" / "figures").glob("*.png")))
    assert len(seen["images"]) == n_png >= 7
    assert all(i["complete"] and i["naturalWidth"] > 0 for i in seen["images"]), seen["images"]
    assert seen["errors"] == []
    assert all(u.startswith(("file://", "data:")) for u in seen["requests"]), seen["requests"]
    # a broken figure is caught: the same check fails on a page with a corrupt image
    bad = tmp_path / "bad.html"
    bad.write_text(out["report"].read_text().replace("base64,iVBOR", "base64,AAAA", 1))
    seen = load_page(bad, binary)
    assert sum(i["naturalWidth"] == 0 for i in seen["images"]) == 1


def test_seed_only_columns_compare_with_welch():
    a = stats.t_interval([0.50, 0.52, 0.51])
    b = stats.t_interval([0.40, 0.41, 0.42])
    c = stats.compare(a, b)
    assert c.resolvable and c.lo < c.diff < c.hi and c.diff == pytest.approx(0.1) and c.mde > 0
    assert not stats.compare(stats.t_interval([0.5, 0.6, 0.4]), stats.t_interval([0.45, 0.55, 0.5])).resolvable
    assert math.isnan(stats.compare(stats.t_interval([0.5]), b).mde)  # one seed: no interval, no claim


# the training accuracy of a real CPU twin run (reward_density_cpu, process-r1-s0, 20 steps of 8 x 4
# samples): noisy (per-step sd ≈ 0.09), climbing from 0.36 to ≈ 0.47 and back to 0.31 -- not a collapse
# the rule may call at this batch size
TWIN_ACCURACY = [0.375, 0.25, 0.25, 0.46875, 0.46875, 0.53125, 0.40625, 0.5, 0.375, 0.46875, 0.53125, 0.34375,
                 0.46875, 0.4375, 0.46875, 0.40625, 0.34375, 0.1875, 0.3125, 0.3125]


def test_reward_collapse_is_noise_aware():
    rows = [{"step": i + 1, "accuracy": a} for i, a in enumerate(TWIN_ACCURACY)]
    assert flags.detect(rows) == {}
    rng = np.random.default_rng(0)
    for _ in range(20):  # flat 0.42 at 32 samples per step: binomial noise alone never flags
        flat = rng.binomial(32, 0.42, size=60) / 32
        assert flags.detect([{"step": i + 1, "accuracy": a} for i, a in enumerate(flat)]) == {}
    # a large-batch run (256 samples per step) that climbs 0.375 -> 0.55 then falls to 0: flagged
    curve = [0.375 + 0.175 * min(i, 20) / 20 - (0.05 * (i - 30) if i > 30 else 0) for i in range(45)]
    noisy = np.clip(np.array(curve) + rng.normal(0, 0.03, 45), 0, 1)
    step = flags.detect([{"step": i + 1, "accuracy": a} for i, a in enumerate(noisy)]).get("reward_collapse")
    assert step is not None and 32 <= step <= 42


def test_accuracy_vs_rank_keeps_prompts_and_their_bases_apart(tmp_path):
    """Cells of two prompts are two lines per β (never averaged together), and each prompt's base is its
    own dashed line with its own label (the CSV beside the PNG is what is drawn)."""
    from lorarl.report.plots import accuracy_vs_rank
    from lorarl.language.study import Study

    study = Study(name="pr", defaults={"model": "local:tiny-test"}, axes={
        "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 4]},
        "kl": {"field": "train.beta", "prefix": "kl", "values": [0.0]},
        "prompt": {"field": "prompt.template", "prefix": "p", "values": ["raw", "chat"]},
        "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}})
    rows = [{"rank": r, "kl": 0.0, "prompt": p, "seed": s, "synthetic/pass@1": acc + 0.01 * s}
            for r, p, acc in [(1, "raw", 0.2), (4, "raw", 0.3), (1, "chat", 0.6), (4, "chat", 0.7)] for s in (0, 1)]
    base = pd.DataFrame({"base": ["base-praw", "base-pchat"], "synthetic/pass@1": [0.1, 0.5]})
    out = accuracy_vs_rank(study, pd.DataFrame(rows), tmp_path / "f.png", "synthetic/pass@1", base)
    drawn = pd.read_csv(out.with_suffix(".csv"))
    lines = drawn.dropna(subset=["rank"])
    assert sorted(set(lines["series"])) == ["kl=0.0, prompt=chat", "kl=0.0, prompt=raw"], set(lines["series"])
    chat = lines[lines["series"] == "kl=0.0, prompt=chat"]
    assert chat["mean"].round(3).tolist() == [0.605, 0.705] and (chat["count"] == 2).all()  # over seeds only
    dashed = drawn[drawn["rank"].isna()]
    assert dashed[["series", "mean"]].values.tolist() == [["base-praw", 0.1], ["base-pchat", 0.5]]
    assert out.stat().st_size > 1000


def test_cumulative_energy_over_matrices_of_unequal_size_is_monotone():
    """A 2-direction and a 4-direction matrix: the mean cumulative energy holds the short one at 1 past
    its end (0.375, 0.75, 0.875, 1), never the non-monotone mean of whichever matrices have index i."""
    from lorarl.report.draw import spectrum_curves

    rows = [{"cell": "c", "matrix": m, "metric": q, "index": i, "group": "g",
             "value": (i + 1) / n if q == "update_cum_energy" else 1 / n}
            for m, n in (("a", 2), ("b", 4)) for i in range(n) for q in ("update_cum_energy", "update_p")]
    out = spectrum_curves(pd.DataFrame(rows), ["group"])
    cum = out[out["metric"] == "update_cum_energy"]
    assert cum["index"].tolist() == [0, 1, 2, 3] and cum["value"].tolist() == [0.375, 0.75, 0.875, 1.0]
    assert out[out["metric"] == "update_p"]["value"].tolist() == [0.375, 0.375, 0.25, 0.25]  # who has index i
