"""The memory plan against a measurement: for two tiny local-recipe models (tiny-test, tiny-arith; random
weights, built here at the recipes' shapes), the plan's peak of one update is within 25% of the peak
measured on the CPU. Measure: torch.profiler's allocator events (``profile_memory=True``) over one real
update of lorarl's trainer (micro-batched loss + backward + AdamW step, lorarl.memory.measure) plus the
bytes of the parameters held before it."""

from __future__ import annotations

import pytest
import torch

from lorarl.language.config import CellConfig
from lorarl.memory.arch import VOCAB_LOCAL, arch_for
from lorarl.memory.measure import generated_batch, measure_update, planned_update, tiny_trainer
from lorarl.models import RECIPES, build_tiny, build_tokenizer


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """results/models/<recipe>/ for both recipes: their shapes, a VOCAB_LOCAL tokenizer, random weights."""
    root = tmp_path_factory.mktemp("memres")
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=VOCAB_LOCAL)
    for name in ("tiny-test", "tiny-arith"):
        torch.manual_seed(0)
        model = build_tiny(RECIPES[name], len(tok), tok.eos_token_id, tok.pad_token_id)
        model.save_pretrained(root / "models" / name)
        tok.save_pretrained(root / "models" / name)
    return str(root)


@pytest.mark.parametrize("recipe,adapter,micro,ckpt", [
    ("tiny-test", {"method": "full"}, None, "off"),  # full fine-tuning, the whole batch at once
    ("tiny-arith", {"method": "lora", "rank": 8}, None, "off"),
    ("tiny-arith", {"method": "lora", "rank": 8}, 4, "on"),  # micro-batches of 4 with checkpointing
])
def test_plan_within_25_percent_of_the_measured_cpu_peak(results, recipe, adapter, micro, ckpt):
    torch.set_num_threads(1)
    cfg = CellConfig.model_validate({"model": f"local:{recipe}", "adapter": adapter, "train": {
        "prompts_per_step": 4, "generations": 4, "max_completion_length": 48, "kl_monitor_every": 0, "beta": 0.0,
        "micro_batch_size": micro, "gradient_checkpointing": ckpt}})
    assert arch_for(cfg.model, results).source.endswith("config.json")  # planned from the built model's config
    trainer, ds = tiny_trainer(f"{results}/models/{recipe}", cfg, results)
    batch = generated_batch(trainer, ds, 4)
    measured = measure_update(trainer, batch)["peak_bytes"]
    planned = planned_update(cfg, batch, results)["plan_bytes"]
    assert 0.75 <= planned / measured <= 1.25, (planned / 1e6, measured / 1e6)
