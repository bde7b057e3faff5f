"""The report's figures and page as a reader sees them: every figure family (and the aggregate's figures) drawn on
synthetic studies keeps each label, title, tick label and legend inside its canvas; a panel with one point shows
it on a readable axis; captions name only axes the study has; the page prints no Python repr.

Two studies: paper 001's shape (tests/support/report_fixture.py: a reward.regime axis, a full fine-tuning bundle, every
figure family but the adaptive one) and the demo study's (experiments/demo.yaml: rank, kl and seed, no regime
axis, a baseline), with diagnostics at one training step only (one point per through-training panel)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.support.report_canvas import capture, captions, no_reprs, outside
from tests.support.study_shapes import fake_results

@pytest.fixture
def drawn(monkeypatch):
    return capture(monkeypatch)


DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"
ONE_STEP = 6  # the demo shape's diagnostics: the through-training rows at this step only


def demo_results(tmp: Path) -> tuple[Path, Path]:
    """The demo study's finished files, each LoRA cell with diagnostics whose through-training rows hold one step."""
    from lorarl import paths
    from lorarl.language.study import load_study, study_cells

    study = load_study(DEMO)
    res = fake_results(study, tmp / "results")
    for k, cell in enumerate(study_cells(study)):
        m = paths.path("metrics", results=res, study=study.name, cell=cell.id)
        steps = pd.read_csv(m)  # paper 001's stability metrics too: the figures whose captions spoke of regimes
        steps.assign(**{"adv/std": 0.8 + 0.01 * k, "frac_truncated": 0.05}).to_csv(m, index=False)
        rows = [{"matrix": f"model.layers.{i}.q_proj", "metric": f"subspace_sim_{w}{sfx}", "index": step,
                 "value": val + 0.01 * k - 0.01 * i} for i in range(2) for w, val in (("top", 0.6), ("bottom", 0.2))
                for sfx, step in (("", 0), ("_step", ONE_STEP))]
        rows += [{"matrix": f"model.layers.{i}.q_proj", "metric": m, "index": 0, "value": v} for i in range(2)
                 for m, v in (("spectral_drift", 0.01), ("max_angle_left_deg", 5.0 + i))]
        rows += [{"matrix": "model.layers.0.q_proj", "metric": m, "index": i, "value": v}
                 for i in range(4) for m, v in (("update_p", 0.25), ("update_cum_energy", (i + 1) / 4))]
        pd.DataFrame(rows).to_parquet(paths.path("diagnostics", results=res, study=study.name, cell=cell.id))
    return DEMO, res


def report(study_path: Path, res: Path) -> tuple[dict, str]:
    from lorarl.report import build
    from lorarl.report.aggregate import aggregate
    from lorarl.language.study import load_study

    aggregate(load_study(study_path), res)  # the aggregate job's figures (lorarl.report.plots)
    out = build(study_path, res)
    return out, out["report"].read_text()


def test_the_demo_study_names_its_own_axes_and_draws_one_point_as_a_point(tmp_path, drawn):
    sp, res = demo_results(tmp_path)
    out, page = report(sp, res)
    assert {"subspace_similarity", "adv_std_peak", "collapse_truncation", "reward_vs_kl", "kl_vs_rank"} <= set(drawn)
    bad = {name: b for name, fig in drawn.items() if (b := outside(fig))}
    assert bad == {}
    caps = captions(page)
    assert caps and not [c for c in caps if "regime" in c]  # no reward.regime axis in this study
    assert any("setting of kl" in c for c in caps) and not [c for c in caps if "{" in c]  # its axes, filled in
    assert no_reprs(page) == [] and "baseline: kl = 0.05" in page
    fig = drawn["subspace_similarity"]
    through = [ax for ax in fig.axes if ax.get_xlabel() == "training step" or "through training" in ax.get_title()]
    assert len(through) == 2
    for ax in through:  # one step: markers on an axis from 0 past the step, integer ticks
        lo, hi = ax.get_xlim()
        assert lo == 0 and ONE_STEP < hi <= 2 * ONE_STEP
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert all(float(t).is_integer() for t in ticks) and len(ticks) >= 3
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
        assert lines and all(ln.get_marker() not in (None, "None", "") and ln.get_markersize() >= 6 for ln in lines)


def test_fit_grows_a_canvas_a_label_overruns_and_leaves_a_fitting_one_alone():
    from lorarl.report import draw

    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], label="a series")
    ax.set_xlabel("a label much wider than these small axes, which centres it and runs past both edges")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    assert outside(fig)  # tight_layout alone leaves it cut
    draw.fit(fig)
    assert outside(fig) == [] and fig.get_size_inches()[0] > 3
    small, ax2 = plt.subplots(figsize=(3, 2))
    ax2.plot(np.arange(3), np.arange(3))
    draw.fit(small)
    assert tuple(small.get_size_inches()) == (3, 2)
    plt.close(fig)
    plt.close(small)
