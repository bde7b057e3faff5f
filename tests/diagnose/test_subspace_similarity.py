"""Paper 003 Fig. 7 per layer and through training: the diagnose stage measures ‖A V‖_F / ‖A‖_F of the LoRA A of
every eval_every snapshot and of the final adapter (rows `subspace_sim_*_step`, index = training step), and the
report's `subspace_similarity` figure averages a layer's modules (left) and all linear layers per step (right)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lorarl import paths
from lorarl.diagnose import weights as dg
from lorarl.language.study import parse_study, study_cells
from tests.support.study import tiny_study


def test_similarity_at_each_step_shares_w0s_svd():
    g = torch.Generator().manual_seed(0)
    W0 = torch.randn(12, 10, generator=g, dtype=torch.float64)
    A_end = torch.randn(2, 10, generator=g, dtype=torch.float64)
    _, _, Vh = torch.linalg.svd(W0, full_matrices=False)
    steps = {5: Vh[:2].clone(), 9: A_end}  # at step 5 A is W0's top-2 right singular vectors: similarity 1, 0
    rows = pd.DataFrame(dg.diagnose_matrix("m", W0, W0 + 0.01, A_end, k=2, vectors=False, A_steps=steps))
    at = rows[rows["metric"].str.endswith("_step")].set_index(["metric", "index"])["value"]
    assert at[("subspace_sim_top_step", 5)] == pytest.approx(1.0) and at[("subspace_sim_bottom_step", 5)] < 1e-9
    end = dg.subspace_similarity(A_end, W0)
    assert at[("subspace_sim_top_step", 9)] == pytest.approx(end["sim_top"])
    assert rows.set_index("metric").loc["subspace_sim_top", "value"] == pytest.approx(end["sim_top"])
    assert sorted(at.index.get_level_values("index").unique()) == [5, 9]


def test_diagnose_cell_reads_the_snapshots(tmp_path):
    """A LoRA cell with eval_every 2 of 4 steps: its snapshot's A at step 2 and the final A at step 4."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lorarl.diagnose.main import diagnose_cell
    from lorarl.models import TinyRecipe, build_tiny
    from lorarl.tracking.client import Tracker

    base = tmp_path / "base"
    build_tiny(TinyRecipe(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=48), 40, 0, 0).save_pretrained(base)
    study = parse_study(tiny_study("diag", task=None, model=str(base), train={"steps": 4}, eval={"eval_every": 2},
                                   axes=None))
    cell = study_cells(study)[0]
    res = tmp_path / "results"
    kw = dict(results=res, study="diag", cell=cell.id)
    saved = {}
    for step, where in ((2, paths.path("snapshot", step=2, **kw)), (4, paths.path("adapter", **kw))):
        torch.manual_seed(step)
        peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                    LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.05)
        peft_model.save_pretrained(where)
        saved[step] = {n.removeprefix("base_model.model.").removesuffix(".lora_A.default.weight"): p.detach().clone()
                       for n, p in peft_model.named_parameters() if "lora_A" in n}
    run_id = Tracker(res, "diag").start(cell.id, cell.id, {}, {})
    paths.path("summary", **kw).write_text(json.dumps({"mlflow_run_id": run_id}))
    diagnose_cell("diag", cell, res)
    df = pd.read_parquet(paths.path("diagnostics", **kw))
    top = df[df["metric"] == "subspace_sim_top_step"]
    assert sorted(top["index"].unique()) == [2, 4] and top["matrix"].nunique() == 7  # q k v o gate up down
    w0 = dict(AutoModelForCausalLM.from_pretrained(base).named_modules())
    for step in (2, 4):
        for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
            want = dg.subspace_similarity(saved[step][name], w0[name].weight)["sim_top"]
            got = top[(top["index"] == step) & (top["matrix"] == name)]["value"].item()
            assert got == pytest.approx(want, rel=1e-5)
    assert saved[2]["model.layers.0.self_attn.q_proj"].ne(saved[4]["model.layers.0.self_attn.q_proj"]).any()


def test_figure_table_averages_modules_per_layer_and_layers_per_step():
    from lorarl.report.fig_subspace import subspace_table

    rows = []
    for cell, seed_shift in (("c0", 0.0), ("c1", 0.1)):
        for layer in (0, 1):
            for mod, v in (("self_attn.q_proj", 0.2), ("mlp.up_proj", 0.4)):
                name = f"model.layers.{layer}.{mod}"
                rows.append({"cell": cell, "init": "rlpo", "matrix": name, "metric": "subspace_sim_top", "index": 0,
                             "value": v + layer * 0.3 + seed_shift})
                rows += [{"cell": cell, "init": "rlpo", "matrix": name, "metric": "subspace_sim_top_step", "index": s,
                          "value": v + s / 100 + seed_shift} for s in (10, 20)]
    data = SimpleNamespace(diag=pd.DataFrame(rows), keys=["init"])
    t = subspace_table(data)
    layers = t.dropna(subset=["layer"]).set_index("layer")["value"]
    assert layers.loc[0.0] == pytest.approx(0.35) and layers.loc[1.0] == pytest.approx(0.65)  # (0.2+0.4)/2 + shift
    steps = t.dropna(subset=["step"]).set_index("step")["value"]
    assert steps.loc[10.0] == pytest.approx(0.45) and steps.loc[20.0] == pytest.approx(0.55)
    assert set(t["metric"]) == {"subspace_sim_top"} and set(t["group"]) == {"init=rlpo"}
