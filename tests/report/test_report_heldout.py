"""Held-out curves over training: paper 001 Fig. 5 (per reward regime, the mean over the regime's cells) and paper
004 Figs. 10-11 (LoRA vs PiSSA per model x rank x lr, from off_principal_lora_pissa's eval_every snapshots)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lorarl.language.evalplan.plan import snapshot_steps
from lorarl.report.data import load
from lorarl.report.figures import load_all
from lorarl.report.registry import REGISTRY
from lorarl.language.study import load_study, study_cells
from tests.support.study_shapes import fake_results

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _draw(name: str, data, tmp: Path) -> pd.DataFrame | None:
    load_all()
    png = REGISTRY[name].draw(data, tmp / f"{name}.png")
    return None if png is None else pd.read_csv(png.with_suffix(".csv"))


def test_001_fig5_is_the_mean_over_each_regimes_cells(tmp_path):
    study = load_study(EXPERIMENTS / "reward_density.yaml")
    data = load(study, fake_results(study, tmp_path / "results"))
    drawn = _draw("heldout_by_regime", data, tmp_path)
    ev = data.evcurves
    assert sorted(drawn["step"].unique()) == [20, 40, 60, 80, 100] and set(drawn["benchmark"]) == {"math500"}
    for regime in ("outcome", "process", "distillation"):
        mine = ev[(ev["regime"] == regime) & (ev["step"] == 40)]
        row = drawn[(drawn["regime"] == regime) & (drawn["step"] == 40)].iloc[0]
        assert row["count"] == 18 == len(mine)  # 6 ranks (full included) x 3 seeds
        assert row["mean"] == pytest.approx(mine["value"].mean())


def test_004_lora_pissa_sweep_has_its_heldout_curve(tmp_path):
    study = load_study(EXPERIMENTS / "off_principal_lora_pissa.yaml")
    assert {tuple(snapshot_steps(c.config)) for c in study_cells(study)} == {tuple(range(20, 200, 20))}
    data = load(study, fake_results(study, tmp_path / "results"))
    drawn = _draw("heldout_vs_baseline", data, tmp_path)
    assert set(drawn["series"]) == {"method=lora", "method=pissa"}
    per = drawn.groupby("benchmark")["group"].nunique().to_dict()
    assert per == {"aime24_evalchemy": 9, "amc23_evalchemy": 9, "math500_evalchemy": 3}  # dsqwen: rank x lr; llama: rank 64 x lr
    assert sorted(drawn["step"].unique()) == list(range(20, 201, 20))
    ev = data.evcurves
    one = ev[(ev["model"] == "llama") & (ev["method"] == "pissa") & (ev["lr"] == "1e-05") & (ev["step"] == 60)]
    row = drawn[(drawn["group"] == "model=llama, rank=64, lr=1e-05") & (drawn["series"] == "method=pissa")
                & (drawn["step"] == 60)]
    assert row["mean"].item() == pytest.approx(one["value"].item()) and row["count"].item() == 1


def test_without_a_baseline_there_is_nothing_to_compare(tmp_path):
    study = load_study(EXPERIMENTS / "off_principal_lora_pissa_cpu.yaml")
    data = load(study, fake_results(study, tmp_path / "results"))
    assert not data.evcurves.empty  # the twin takes its snapshot too (step 1 of 2)
    data.study = data.study.model_copy(update={"baseline": None})
    assert _draw("heldout_vs_baseline", data, tmp_path) is None
