"""One cell, one result (docs/packed.md): a cell trained by the solo job (TRL's GRPOTrainer, lorarl.train.trainer)
equals the same cell trained as a pack of one (lorarl.pack.steps / trainer), and so in any pack (tests/
test_pack_steps.py: a pack of K = K packs of one): the same sampled token ids at every step, every metric both
log and the trained adapter within 1e-6 in float32 on the CPU (bit for bit on the adapter where measured), for
LoRA, a residual init (PiSSA), DoRA, beta 0 and beta > 0, each loss type, with warm-up, weight decay, clipping
and the KL monitors. Each member of a pack of two ranks equals its own solo run, whatever runtime knob (micro-batch,
token budget, update chunks, grouped adapter terms, generation batch) either host runs with."""

from __future__ import annotations

import pytest

from tests.support.solo_pack import assert_same_result, cell_config, train_pack, train_pack_of_one, train_solo, with_runtime

CASES = {  # name: (adapter, train) - together: every loss type, beta 0 and > 0, LoRA / PiSSA / DoRA
    "lora-grpo-beta0": ({}, {"loss_type": "grpo"}),
    "lora-dapo-beta-monitor": ({}, {"loss_type": "dapo", "beta": 0.05, "kl_monitor_every": 1, "temperature": 0.7}),
    "pissa-bnpo-beta": ({"init": "pissa"}, {"loss_type": "bnpo", "beta": 0.05, "warmup_ratio": 0.5}),
    "dora-drgrpo": ({"method": "dora"}, {"loss_type": "dr_grpo", "scale_rewards": "none", "weight_decay": 0.1,
                                         "max_grad_norm": 0.05, "top_p": 0.9}),
}


MEMBERS = (({"rank": 2, "alpha": 4}, {}),  # one pack of two ranks: (adapter, train) of each member
           ({"rank": 8, "alpha": 16}, {"beta": 0.05, "kl_monitor_every": 1}))

KNOBS = {  # name: (the solo runs' runtime fields, the pack's runtime fields, the pack's build options); never results
    "mixed-ranks": ({}, {}, {}),
    "solo-micro-batch-1": ({"train": {"micro_batch_size": 1}}, {}, {}),
    "solo-micro-tokens-20": ({"train": {"micro_batch_tokens": 20}}, {}, {}),
    "pack-micro-batch-3": ({}, {"train": {"micro_batch_size": 3}}, {}),
    "pack-update-cells-1": ({}, {}, {"update_cells": 1}),
    "pack-grouped": ({}, {}, {"grouped": True}),
    "pack-generation-batch-3": ({}, {"rollout": {"generation_batch_size": 3}}, {}),  # chunks across the members
    "pack-batch-invariant": ({}, {"runtime": {"batch_invariant": True}, "rollout": {"generation_batch_size": 3}}, {}),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.support.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("name", list(CASES))
def test_solo_job_equals_a_pack_of_one(name, tiny_dir, tmp_path):
    adapter, train = CASES[name]
    cfg = cell_config(tiny_dir, seed=3, adapter=adapter, train=train)
    assert_same_result(train_solo(cfg, tmp_path), train_pack_of_one(cfg, tmp_path), tol=1e-6)


@pytest.fixture(scope="module")
def plain(tiny_dir, tmp_path_factory):
    """The two members' solo runs and their pack of two, no runtime knob set (what every knob is compared with)."""
    results = tmp_path_factory.mktemp("plain")
    cfgs = [cell_config(tiny_dir, seed=3 + k, adapter=a, train=t) for k, (a, t) in enumerate(MEMBERS)]
    return cfgs, [train_solo(c, results) for c in cfgs], train_pack(cfgs, results)


def test_the_knobs_are_runtime_only(tiny_dir):
    """Every field of the table leaves the cell's training signature as it is; a science field does not."""
    cfg = cell_config(tiny_dir)
    for solo_knobs, pack_knobs, _ in KNOBS.values():
        with_runtime(with_runtime(cfg, **solo_knobs), **pack_knobs)
    with pytest.raises(ValueError, match="not runtime-only"):
        with_runtime(cfg, train={"max_completion_length": 4})


@pytest.mark.parametrize("name", list(KNOBS))
def test_runtime_knobs_and_pack_mates_never_move_a_result(name, plain, tmp_path):
    """A member of a pack of two ranks (2 and 8) equals its solo run, whatever the runtime knobs on either side:
    the same token ids, metrics and adapter within 1e-6 (docs/packed.md, "One cell, one result")."""
    cfgs, solos, packed = plain
    solo_knobs, pack_knobs, options = KNOBS[name]
    if solo_knobs:
        solos = [train_solo(with_runtime(c, **solo_knobs), tmp_path) for c in cfgs]
    if pack_knobs or options:
        packed = train_pack([with_runtime(c, **pack_knobs) for c in cfgs], tmp_path, **options)
    for solo, member in zip(solos, packed):
        assert_same_result(solo, member, tol=1e-6)
