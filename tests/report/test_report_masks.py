"""Paper 004 Tables 4-5 in the report of a sparse-mask study: the held-out headline of each benchmark at the step-320
snapshot (Table 4, its own table) and at the final step (Table 5), their Average, and the mask density over the
linear layers each cell trained with (the paper's "#params"), read from the cell's adapter fingerprint."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pandas as pd
import pytest

from lorarl import paths
from lorarl.report.data import load
from lorarl.report.masks import mask_density, mask_tables
from lorarl.language.study import load_study, parse_study, study_cells
from tests.support.study_shapes import fake_results

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def test_tables_4_and_5_with_the_density_of_each_mask(tmp_path):
    from lorarl.report import build

    study = load_study(EXPERIMENTS / "off_principal_masks.yaml")
    res = fake_results(study, tmp_path / "results")
    data = load(study, res)
    tables = mask_tables(data)
    assert list(tables) == ["masks_step320", "masks_final"]
    labels = ["dense", "principal", "nonprincipal", "low_magnitude", "safe", "random"]
    ids = {c.axes["mask"]: c.id for c in study_cells(study)}
    for name, t in tables.items():
        assert t["mask"].tolist() == labels and t["is_baseline"].tolist() == [True] + [False] * 5
        for _, row in t.iterrows():
            fp = data.summaries[ids[row["mask"]]]["adapter"]["structure"].get("masks")
            assert row["mask_density_mean"] == (fp["density"] if fp else 1.0)  # dense: every weight trains
        cols = [c.removesuffix("_mean") for c in t if "@" in c and c.endswith("_mean")]
        assert cols == ["math500_evalchemy/avg@2", "amc23_evalchemy/avg@32", "aime24_evalchemy/avg@64",
                        "aime25_evalchemy/avg@64"]
        assert t["avg_mean"].tolist() == pytest.approx(t[[f"{c}_mean" for c in cols]].mean(axis=1).tolist())
    cell = ids["safe"]
    for col in cols:  # Table 4: the snapshot's evaluation at step 320; Table 5: the final one
        bench, metric = col.split("/")
        at = json.loads(paths.path("eval_step_summary", results=res, study=study.name, cell=cell, benchmark=bench,
                                   step=320).read_text())["metrics"][metric]["value"]
        end = json.loads(paths.path("eval_summary", results=res, study=study.name, cell=cell,
                                    benchmark=bench).read_text())["metrics"][metric]["value"]
        assert tables["masks_step320"].set_index("mask").at["safe", f"{col}_mean"] == pytest.approx(at)
        assert tables["masks_final"].set_index("mask").at["safe", f"{col}_mean"] == pytest.approx(end)
    with mock.patch("lorarl.report.figures.draw_all", return_value=({}, {})):
        out = build(EXPERIMENTS / "off_principal_masks.yaml", res)
    page = out["report"].read_text()
    assert "held-out at step 320, Average and mask density" in page and "Table 4 reads step 320 of 500" in page
    assert "held-out at the final step (500)" in page and pd.read_csv(out["masks_step320"]).shape[0] == 6
    assert mask_tables(load(load_study(EXPERIMENTS / "peft_zoo_cpu.yaml"), res)) == {}  # no mask: no such table


def test_density_is_the_fingerprints(tmp_path):
    """The density a real masked build records (trained entries of every linear layer but the head)."""
    from transformers import AutoModelForCausalLM

    from lorarl.adapters.build import build_adapter
    from lorarl.models import TinyRecipe, build_tiny

    base = tmp_path / "base"
    build_tiny(TinyRecipe(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=48), 40, 0, 0).save_pretrained(base)
    study = parse_study({"name": "m", "defaults": {"model": str(base), "adapter": {"method": "full"}},
                         "axes": {"mask": {"values": [{"label": "dense", "set": {"adapter.mask": None}},
                                                      {"label": "safe", "set": {"adapter.mask": "safe",
                                                                                "adapter.mask_alpha": 0.3}}]}}})
    summaries = {}
    for cell in study_cells(study):
        policy = build_adapter(AutoModelForCausalLM.from_pretrained(base), cell.config)
        summaries[cell.id] = json.loads(json.dumps({"adapter": policy.fingerprint}))
        if cell.axes["mask"] == "safe":
            masks = policy.ctx.masks
            want = sum(int(m.sum()) for _, m in masks.values()) / sum(m.numel() for _, m in masks.values())
            assert len(masks) == 7  # every linear layer of the block, the head excluded
    got = mask_density(SimpleNamespace(study=study, summaries=summaries))
    ids = {c.axes["mask"]: c.id for c in study_cells(study)}
    assert got[ids["dense"]] == 1.0 and got[ids["safe"]] == pytest.approx(want) and 0.3 < want < 1.0
