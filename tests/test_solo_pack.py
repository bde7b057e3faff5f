"""One cell, one result (docs/packed.md): a cell trained by the solo job (TRL's GRPOTrainer, lorarl.train.trainer)
equals the same cell trained as a pack of one (lorarl.pack.steps / trainer), and so in any pack (tests/
test_pack_steps.py: a pack of K = K packs of one): the same sampled token ids at every step, every metric both
log and the trained adapter within 1e-6 in float32 on the CPU (bit for bit on the adapter where measured), for
LoRA, a residual init (PiSSA), DoRA, beta 0 and beta > 0, each loss type, with warm-up, weight decay, clipping
and the KL monitors."""

from __future__ import annotations

import pytest

from tests.solo_pack import assert_same_result, cell_config, train_pack_of_one, train_solo

CASES = {  # name: (adapter, train) - together: every loss type, beta 0 and > 0, LoRA / PiSSA / DoRA
    "lora-grpo-beta0": ({}, {"loss_type": "grpo"}),
    "lora-dapo-beta-monitor": ({}, {"loss_type": "dapo", "beta": 0.05, "kl_monitor_every": 1, "temperature": 0.7}),
    "pissa-bnpo-beta": ({"init": "pissa"}, {"loss_type": "bnpo", "beta": 0.05, "warmup_ratio": 0.5}),
    "dora-drgrpo": ({"method": "dora"}, {"loss_type": "dr_grpo", "scale_rewards": "none", "weight_decay": 0.1,
                                         "max_grad_norm": 0.05, "top_p": 0.9}),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("name", list(CASES))
def test_solo_job_equals_a_pack_of_one(name, tiny_dir, tmp_path):
    adapter, train = CASES[name]
    cfg = cell_config(tiny_dir, seed=3, adapter=adapter, train=train)
    assert_same_result(train_solo(cfg, tmp_path), train_pack_of_one(cfg, tmp_path), tol=1e-6)
