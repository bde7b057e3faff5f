"""lorarl.adapters inside the real trainer (train_cell → lorarl.train.trainer trainer → TRL): the method's own
optimiser and callbacks are used, the fingerprint reaches summary.json and MLflow, and the invariants
hold after real GRPO steps. One untrained tiny model (no SFT: rewards are ~0, gradients are not)."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

from lorarl.language.study import study_cells, parse_study
from tests.support.study import tiny_study

warnings.filterwarnings("ignore")

STUDY = tiny_study(
    "adapters_e2e", adapter=None, eval=None, task={"name": "synthetic", "n_train": 32, "n_eval": 8},
    train={"steps": 2, "prompts_per_step": 2, "generations": 2, "max_completion_length": 8, "lr": 1e-2,
           "temperature": 1.0, "kl_monitor_every": 1, "loss_type": "dapo"},
    axes={"m": {"values": [
        {"label": "lora_plus", "set": {"adapter.method": "lora_plus", "adapter.rank": 4, "adapter.lr_ratio": 8}},
        {"label": "lora_fa", "set": {"adapter.method": "lora_fa", "adapter.rank": 4, "adapter.init": "rlpo"}},
        {"label": "adalora", "set": {"adapter.method": "adalora", "adapter.rank": 4}},
        {"label": "pissa", "set": {"adapter.method": "dora", "adapter.rank": 4, "adapter.init": "pissa"}},
        {"label": "safe", "set": {"adapter.method": "full", "adapter.mask": "safe", "train.weight_decay": 0.1}},
    ]}})


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """results/models/tiny-test: the recipe's tokenizer and architecture, untrained (no SFT)."""
    from lorarl.models import RECIPES, build_tiny, build_tokenizer
    from lorarl.tasks.synthetic import make_splits

    res = tmp_path_factory.mktemp("adapters_e2e")
    recipe = RECIPES["tiny-test"]
    train, _ = make_splits(recipe.task_seed, 200, 1, max_ops=recipe.max_operands, max_value=recipe.max_value)
    tok = build_tokenizer([p.prompt + p.solution for p in train] + ["0123456789+-=?\nQA: \\boxed{}"])
    model = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out = res / "models" / "tiny-test"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return res


@pytest.fixture(scope="module")
def trained(results):
    """Train every cell; keep (cell, summary, policy, trainer) - the trainer captured at `attach`."""
    from lorarl.adapters.build import AdaptedPolicy
    from lorarl.train.main import train_cell

    seen = []
    real_attach = AdaptedPolicy.attach

    def spy(self, trainer):
        seen.append((self, trainer))
        return real_attach(self, trainer)

    mp = pytest.MonkeyPatch()
    mp.setattr(AdaptedPolicy, "attach", spy)
    study = parse_study(STUDY)
    out = {}
    try:
        for cell in study_cells(study):
            summary = train_cell(study.name, cell, results, threads=1)
            out[cell.id] = (cell, summary, *seen[-1])
    finally:
        mp.undo()
    return out


def _base(results):
    from lorarl.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(results / "models" / "tiny-test"))[0]


def test_every_cell_records_the_method_it_trained(trained, results):
    want = {"lora_plus": "AdamW", "lora_fa": "LoraFAOptimizer", "adalora": "trainer default (AdamW)",
            "pissa": "trainer default (AdamW)", "safe": "MaskedAdamW"}
    for cid, (cell, summary, policy, trainer) in trained.items():
        fp = summary["adapter"]
        assert fp["method"] == cell.config.adapter.method and fp["optimizer"]["class"] == want[cid]
        assert summary["steps"] == 2 and summary["params_trainable"] == fp["params_trainable"]
        assert summary["precision"] == "fp32" and set(summary["trainable_dtypes"]) == {"float32"}  # CPU default
        on_disk = json.loads((results / "adapters_e2e" / cid / "summary.json").read_text())
        assert on_disk["adapter"]["init_checksum"] == fp["init_checksum"]
    lp = trained["lora_plus"][1]["adapter"]["optimizer"]["group_lrs"]
    assert lp["lora_B"] == 8 * lp["lora_A"]
    assert trained["safe"][1]["trainable_fraction"] < 1.0


def test_pipeline_kl_to_the_original_base_is_zero_at_the_first_step(trained, results):
    """The trainer's own monitor (kl_monitor_every=1) against its frozen base copy: invariant 1 end to end."""
    import pandas as pd

    for cid in trained:
        df = pd.read_csv(results / "adapters_e2e" / cid / "metrics.csv")
        cols = [c for c in df.columns if c.startswith("kl_ref/")]
        assert cols, "no kl_ref/* monitor columns in metrics.csv"
        first = df[cols].iloc[0]
        assert first.abs().max() < 1e-5, (cid, first.to_dict())


def test_mlflow_run_carries_the_fingerprint(trained, results):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{results.resolve()}/mlflow.db")
    for cid, (cell, summary, _, _) in trained.items():
        tags = client.get_run(summary["mlflow_run_id"]).data.tags
        assert tags["adapter.method"] == cell.config.adapter.method
        assert tags["adapter.init_checksum"] == summary["adapter"]["init_checksum"]


def test_the_trainer_stepped_the_methods_own_optimiser(trained):
    for cid, (cell, summary, policy, trainer) in trained.items():
        opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
        if policy.optimizer is None:
            assert type(opt).__name__ == "AdamW", cid
            continue
        assert opt is policy.optimizer, cid
        steps = {int(st["step"]) for st in opt.state.values() if "step" in st}
        assert steps == {2}, (cid, steps)
    names = [type(cb).__name__ for cb in trained["adalora"][3].callback_handler.callbacks]
    assert "AdaLoraCallback" in names


def test_adalora_budget_allocation_ran_inside_the_trainer(trained, results):
    cfg = json.loads((results / "adapters_e2e" / "adalora" / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "ADALORA" and cfg["rank_pattern"], "update_and_allocate never ran"


def test_lora_fa_A_is_still_its_init_after_training(trained, results):
    from safetensors.torch import load_file

    from lorarl.adapters import build_adapter

    cell = trained["lora_fa"][0]
    fresh = build_adapter(_base(results), cell.config)
    saved = load_file(str(results / "adapters_e2e" / "lora_fa" / "adapter" / "adapter_model.safetensors"))
    init_A = {n.replace(".default", ""): p for n, p in fresh.model.named_parameters() if "lora_A" in n}
    init_B = {n.replace(".default", ""): p for n, p in fresh.model.named_parameters() if "lora_B" in n}
    assert set(init_A) <= set(saved)
    assert all(torch.equal(saved[n], p) for n, p in init_A.items())
    assert set(init_B) <= set(saved)  # (B moves only where advantages are non-zero: untrained model)


def test_masked_full_finetuning_froze_the_masked_out_entries(trained, results):
    from lorarl.adapters import build_adapter
    from lorarl.models import load_model_and_tokenizer

    cell = trained["safe"][0]
    base = _base(results)
    fresh = build_adapter(copy.deepcopy(base), cell.config)
    after = load_model_and_tokenizer(str(results / "adapters_e2e" / "safe" / "adapter"))[0]
    after_params = dict(after.named_parameters())
    moved = 0
    for name, (p0, mask) in fresh.ctx.masks.items():
        p1 = after_params[name + ".weight"]
        assert torch.equal(p1[~mask], p0[~mask]), name
        moved += int((p1[mask] != p0[mask]).sum())
    assert moved > 0  # weight decay (0.1) moved the masked-in entries even where advantages are 0


def test_residual_dora_adapter_loads_on_the_original_base(trained, results):
    from peft import PeftModel

    cell = trained["pissa"][0]
    cfg = json.loads((results / "adapters_e2e" / "pissa" / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 2 * cell.config.adapter.rank and cfg["use_dora"] is True
    model = PeftModel.from_pretrained(_base(results), results / "adapters_e2e" / "pissa" / "adapter").eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
