"""train.precision (lorarl.numerics.precision): fp32 master weights keep updates that pure bf16 rounds away."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lorarl.language.config import CellConfig
from lorarl.numerics.precision import autocast_bf16, cast_trainable, load_dtype, resolve_precision, trainable_dtypes
from tests.support.study import tiny_study


def test_resolution_per_device_and_load_dtypes():
    assert resolve_precision(None, "cpu") == "fp32" and resolve_precision(None, "cuda") == "bf16-mixed"
    assert resolve_precision("bf16-pure", "cpu") == "bf16-pure"
    with pytest.raises(ValueError, match="allowed: bf16-mixed, fp32, bf16-pure"):
        resolve_precision("fp16", "cuda")
    with pytest.raises(ValueError, match="precision"):
        CellConfig(train={"precision": "fp16"})
    assert load_dtype("bf16-mixed", "full") == "float32"  # every weight of full FT is a master weight
    assert load_dtype("bf16-mixed", "lora") == "bfloat16"  # the frozen base may stay bf16
    assert load_dtype("bf16-pure", "full") == "bfloat16" and load_dtype("fp32", "lora") == "float32"
    assert autocast_bf16("bf16-mixed") and not autocast_bf16("bf16-pure") and not autocast_bf16("fp32")


def test_grpo_args_follow_the_resolved_precision(tmp_path):
    from lorarl.train.trl_args import grpo_args

    cfg = CellConfig()
    assert grpo_args(cfg, tmp_path, use_cpu=True).bf16 is False  # null on the CPU: fp32
    assert grpo_args(cfg, tmp_path, use_cpu=True, precision="bf16-mixed").bf16 is True


@pytest.fixture(scope="module")
def tiny():
    from lorarl.models import TinyRecipe, build_tiny

    torch.manual_seed(0)
    return build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), 64, 0, 0)


def _one_tiny_step(tiny, method, precision, lr=1e-5):
    """Load as train.precision says, build the adapter, one AdamW step (bf16 autocast when mixed).
    Returns the fraction of trainable elements that moved, and the trainable dtypes."""
    from lorarl.adapters import build_adapter

    model = copy.deepcopy(tiny).to(getattr(torch, load_dtype(precision, method)))
    cfg = CellConfig(adapter={"method": method, **({"rank": 4} if method != "full" else {})})
    policy = build_adapter(model, cfg, precision=precision)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if method != "full":  # B0 = 0: move B off zero first, so the step under test changes A and B alike
        with torch.no_grad():
            for p in params:
                p.add_(0.5)
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    ids = torch.randint(1, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16(precision)):
        loss = policy.model(input_ids=ids, labels=ids).loss
    loss.backward()
    grad = [p.grad != 0 for p in params]  # Adam moves exactly these elements (unused embedding rows: no)
    opt.step()
    moved = sum(int(((p.detach() != b) & g).sum()) for p, b, g in zip(params, before, grad))
    return moved / sum(int(g.sum()) for g in grad), trainable_dtypes(policy.model)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_tiny_update_survives_mixed_precision_and_is_lost_in_pure_bf16(tiny, method):
    mixed, mixed_dtypes = _one_tiny_step(tiny, method, "bf16-mixed")
    pure, pure_dtypes = _one_tiny_step(tiny, method, "bf16-pure")
    fp32, _ = _one_tiny_step(tiny, method, "fp32")
    assert set(mixed_dtypes) == {"float32"} and set(pure_dtypes) == {"bfloat16"}
    assert mixed > 0.99 and fp32 > 0.99  # Adam moves every element by ~lr: fp32 master weights keep it
    assert pure < 0.2  # below half a bf16 ulp of the weight: rounded away


def test_cast_trainable_leaves_frozen_weights_alone(tiny):
    model = copy.deepcopy(tiny).to(torch.bfloat16)
    model.model.embed_tokens.weight.requires_grad_(False)
    cast_trainable(model, "bf16-mixed")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_train_cell_runs_bf16_mixed_end_to_end_on_the_cpu(tmp_path, method):
    """The whole train stage under bf16-mixed (CPU bf16 autocast): fp32 trainable tensors, a bf16
    reference for the KL monitor, finite rewards; the resolved setting lands in summary.json."""
    from lorarl.models import RECIPES, build_tiny, build_tokenizer
    from lorarl.language.study import parse_study, study_cells
    from lorarl.tasks.synthetic import make_splits
    from lorarl.train.main import train_cell

    recipe = RECIPES["tiny-test"]
    train, _ = make_splits(recipe.task_seed, 100, 1, max_ops=recipe.max_operands, max_value=recipe.max_value)
    tok = build_tokenizer([p.prompt + p.solution for p in train] + ["0123456789+-=?\nQA: \\boxed{}"])
    model = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    model.save_pretrained(tmp_path / "models" / "tiny-test")
    tok.save_pretrained(tmp_path / "models" / "tiny-test")
    study = parse_study(tiny_study(
        "prec", eval=None, task={"n_train": 16, "n_eval": 4},
        adapter={"method": method, **({"rank": 4} if method == "lora" else {})},
        train={"steps": 2, "prompts_per_step": 2, "generations": 2, "max_completion_length": 6,
               "kl_monitor_every": 1, "beta": 0.01, "precision": "bf16-mixed", "checkpoint_every": 0}, axes=None))
    summary = train_cell(study.name, study_cells(study)[0], tmp_path, threads=1)
    assert summary["precision"] == "bf16-mixed" and set(summary["trainable_dtypes"]) == {"float32"}
    assert summary["steps"] == 2 and math.isfinite(summary["final_train_reward"])


@pytest.mark.parametrize("method", ["lora", "dora", "rslora", "adalora", "miss", "vera", "ia3", "ln_tuning",
                                    "lora_plus", "lora_fa"])
def test_every_peft_method_trains_fp32_tensors_on_a_bf16_base_under_mixed(tiny, method):
    from lorarl.adapters import build_adapter

    adapter = {"method": method, **({"rank": 8} if method in ("miss", "vera") else {})}
    for precision, want in (("bf16-mixed", torch.float32), ("bf16-pure", torch.bfloat16)):
        model = copy.deepcopy(tiny).to(getattr(torch, load_dtype(precision, method)))
        policy = build_adapter(model, CellConfig(adapter=adapter), precision=precision)
        dtypes = {p.dtype for p in policy.model.parameters() if p.requires_grad}
        frozen = {p.dtype for n, p in policy.model.named_parameters() if not p.requires_grad and "lora_" not in n}
        assert dtypes == {want} and frozen == {torch.bfloat16}, (precision, dtypes, frozen)  # (LoRA-FA's A: frozen)
        if policy.optimizer is not None:  # the method's own optimiser holds the cast tensors
            held = {p.dtype for g in policy.optimizer.param_groups for p in g["params"] if p.requires_grad}
            assert held == {want}
