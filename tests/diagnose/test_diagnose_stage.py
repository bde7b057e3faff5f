"""The diagnose stage (original W0 vs merged W+) and the toy KL-bound study through its pipeline code."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from lorarl import paths
from lorarl.language.study import study_cells, parse_study


@pytest.fixture()
def tiny_base(tmp_path):
    from lorarl.models import TinyRecipe, build_tiny

    model = build_tiny(TinyRecipe(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=48), 40, 0, 0)
    model.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def test_weight_pairs_and_diagnose_cell(tmp_path, tiny_base):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lorarl.diagnose.main import diagnose_cell, weight_pairs
    from lorarl.tracking.client import Tracker

    study = parse_study({"name": "diag", "defaults": {"model": str(tiny_base), "adapter": {"rank": 2, "alpha": 4}}})
    cell = study_cells(study)[0]
    results = tmp_path / "results"
    adapter_dir = paths.path("adapter", results=results, study="diag", cell=cell.id)
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_base),
                                LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)  # non-zero update so W+ != W0
    peft_model.save_pretrained(adapter_dir)

    pairs, key = weight_pairs(str(tiny_base), adapter_dir, full=False)
    assert len(pairs) == 7  # q, k, v, o, gate, up, down of the single layer
    mods = dict(peft_model.named_modules())
    for name, (w0, w1, a, product, update) in pairs.items():
        assert product is None  # plain LoRA: the product is W+ − W0 itself
        lora = mods[f"base_model.model.{name}"]
        expected = w0 + 2.0 * lora.lora_B["default"].weight @ lora.lora_A["default"].weight
        assert torch.allclose(w1, expected, atol=1e-6)
        assert torch.equal(a, lora.lora_A["default"].weight)
        assert update.s == 2.0 and torch.allclose(update.dense().float(), w1 - w0, atol=1e-6)  # low-rank path

    tracker = Tracker(results, "diag")
    run_id = tracker.start(cell.id, cell.id, {}, {})
    paths.path("summary", results=results, study="diag", cell=cell.id).write_text(json.dumps({"mlflow_run_id": run_id}))
    out = diagnose_cell("diag", cell, results)
    assert out["matrices"] == 7 and 0 < out["diag/spectral_drift"] < 1
    assert len(list((results / "svd_cache" / key / "diagnose").glob("*.pt"))) == 7  # W0's factors, for the next cell
    df = pd.read_parquet(paths.path("diagnostics", results=results, study="diag", cell=cell.id))
    assert set(df.columns) == {"matrix", "metric", "index", "value"}
    assert {"spectral_drift", "bf16_sparsity", "subspace_sim_top", "update_cum_energy"} <= set(df["metric"])
    assert "diag/bf16_sparsity" in tracker.client.get_run(run_id).data.metrics


def test_residual_init_diagnoses_the_adapter_product(tmp_path, tiny_base):
    """PiSSA (a residual init): its adapter is saved converted for the original base (rank 2r), so W+ − W0
    = s(BA − B0A0); the diagnose stage recovers the trained A and s·BA (paper 003 Fig. 3's matrix) and
    writes its SVD-aligned view as product_update_* beside update_* of W+ − W0."""
    from transformers import AutoModelForCausalLM

    from lorarl.adapters.build import build_adapter
    from lorarl.language.config import CellConfig
    from lorarl.diagnose.main import weight_pairs
    from lorarl.diagnose.weights import diagnose_model

    cfg = CellConfig.model_validate({"model": str(tiny_base), "adapter": {"rank": 2, "alpha": 4, "init": "pissa"}})
    policy = build_adapter(AutoModelForCausalLM.from_pretrained(tiny_base), cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n or "lora_A" in n:
                p.add_(torch.randn_like(p) * 0.05)  # training moved both factors
    policy.save(tmp_path / "adapter")
    pairs, _ = weight_pairs(str(tiny_base), tmp_path / "adapter", full=False)
    mods = dict(policy.model.named_modules())
    name, (w0, w1, a, product, update) = next(iter(pairs.items()))
    lora = mods[f"base_model.model.{name}"]
    A, B = lora.lora_A["default"].weight, lora.lora_B["default"].weight
    assert torch.allclose(a, A) and torch.allclose(product.dense().float(), 2.0 * B @ A, atol=1e-6)
    assert not torch.allclose(product.dense().float(), w1 - w0, atol=1e-3)  # the two views differ for a residual init
    assert torch.allclose(update.dense().float(), w1 - w0, atol=1e-6)  # W+ − W0 = s·[B, −B0]·[A; A0], rank 2r
    df = diagnose_model(pairs, k=2)
    both = df[df["matrix"] == name]
    assert {"update_p", "product_update_p", "product_update_cum_energy"} <= set(both["metric"])
    assert both[both["metric"] == "product_update_cum_energy"]["value"].iloc[-1] == pytest.approx(1.0)


def test_toy_study_cells_runs_and_aggregate(tmp_path):
    import mlflow

    from lorarl.toy.cells import aggregate_toy, run_toy_study

    study = parse_study({
        "name": "toy", "kind": "kl_bound_toy", "defaults": {"toy": {"epochs": 2}},
        "axes": {"rank": {"field": "rank", "prefix": "r", "values": [1, 8]},
                 "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}},
    })
    rows = run_toy_study(study, tmp_path)
    assert len(rows) == 4 and all(r["kl"] <= r["bound"] for r in rows)
    for c in study_cells(study):
        s = json.loads(paths.path("summary", results=tmp_path, study="toy", cell=c.id).read_text())
        assert s["bound_holds"] and s["rank"] == c.config.rank
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("toy").experiment_id], "tags.`lorarl.cell_id` != ''")
    assert sorted(r.data.tags["lorarl.cell_id"] for r in runs) == ["r1-s0", "r1-s1", "r8-s0", "r8-s1"]
    out = aggregate_toy(study, tmp_path)
    table = pd.read_csv(paths.path("table_csv", results=tmp_path, study="toy"))
    assert list(table["rank"]) == [1, 8] and table["bound_holds"].all()
    assert (table["bound_mean"] > table["kl_mean"]).all()
    assert out["figure"].stat().st_size > 1000
    verdict = pd.read_csv(out["verdict"])
    assert list(verdict["setting"]) == ["default"] and verdict["bound_holds_every_seed"].all()
    assert "KL rises with rank" in out["table_md"].read_text()


def test_toy_study_verdict_per_optimizer(tmp_path):
    """The published toy study's shape: an optimizer axis; the table says per optimizer whether the
    KL rises with rank (Adam: yes, clipped SGD at the paper's lr: no) and whether the bound holds."""
    from lorarl.toy.cells import aggregate_toy, run_toy_study

    study = parse_study({
        "name": "toy2", "kind": "kl_bound_toy", "defaults": {"toy": {"epochs": 3}},
        "axes": {"optimizer": {"field": "toy.optimizer", "values": ["adam", "sgd"]},
                 "rank": {"field": "rank", "prefix": "r", "values": [1, 16]},
                 "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}},
    })
    run_toy_study(study, tmp_path)
    out = aggregate_toy(study, tmp_path)
    verdict = pd.read_csv(out["verdict"]).set_index("setting")
    assert list(verdict.index) == ["adam", "sgd"]
    assert verdict.loc["adam", "rises"] and not verdict.loc["sgd", "rises"]
    assert verdict["bound_holds_every_seed"].all() and (verdict["n_cells"] == 4).all()
    assert verdict.loc["adam", "slope"] > 0.3
    md = out["table_md"].read_text()
    assert "| adam | yes |" in md and "| sgd | no |" in md


def test_diagnostics_figure_and_tables(tmp_path):
    from lorarl.diagnose.weights import diagnose_model
    from lorarl.report.plots import diagnostics_figure

    study = parse_study({"name": "d", "axes": {"rank": {"field": "adapter.rank", "values": [1, 4]},
                                             "seed": {"field": "seed", "values": [0, 1]}}})
    frames = []
    g = torch.Generator().manual_seed(0)
    for cell in study_cells(study):
        r = cell.config.adapter.rank
        pairs = {}
        for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"):
            w0 = torch.randn(24, 16, generator=g)
            a = torch.randn(r, 16, generator=g)
            pairs[name] = (w0, w0 + 0.01 * torch.randn(24, r, generator=g) @ a, a)
        frames.append(diagnose_model(pairs, k=4).assign(cell=cell.id, **cell.axes))
    out = diagnostics_figure(study, pd.concat(frames), tmp_path / "diagnostics.png")
    assert out.stat().st_size > 5000
    curves = pd.read_csv(tmp_path / "diagnostics_curves.csv")
    assert set(curves["metric"]) == {"update_p", "update_cum_energy"}
    cum = curves[curves["metric"] == "update_cum_energy"].groupby("group")["value"].max()
    assert (cum.round(6) == 1.0).all()  # cumulative energy ends at 1 for every group
    per_matrix = pd.read_csv(tmp_path / "diagnostics_per_matrix.csv")
    assert len(per_matrix) == 4  # 2 groups x 2 matrices


def test_low_rank_path_only_where_the_merge_is_s_b_a():
    """A merged W+ that is W0 + s·B·A (up to float32 rounding) takes the low-rank path; a DoRA-like column
    rescale or a masked merge of the same factors keeps the dense one."""
    from lorarl.diagnose.main import _low_rank_update
    from lorarl.diagnose.weights import LowRank

    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(24, 16, generator=g)
    up = LowRank(0.1 * torch.randn(24, 2, generator=g), torch.randn(2, 16, generator=g), 2.0)
    merged = w0 + up.s * (up.B_DR @ up.A_RN)
    assert _low_rank_update(w0, merged, up)
    assert not _low_rank_update(w0, merged * (1 + 0.01 * torch.randn(16, generator=g)), up)  # DoRA magnitude
    assert not _low_rank_update(w0, w0 + up.s * (up.B_DR @ up.A_RN) * (torch.rand(24, 16, generator=g) < 0.5), up)
