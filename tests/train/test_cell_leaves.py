"""A cell leaves at a step boundary with its full state and comes back equal (lorarl.train.cellstate, engine "pack").

A cell X trains in a pack beside other members, leaves at step K (its state written by the pack job's own writer:
weights by name, AdamW moments and step, LR schedule, data order, sampling generator, step; its monitors), and
comes back at ANOTHER position of ANOTHER pack (built, as a resident job's re-form, on the first pack's door: the
same base object, reference and data, lorarl.pack.build.Door), beside members of other ranks that start from step 0. Its metrics
rows (every key but wall-clock times and the pack size) equal its uninterrupted solo run's (a pack of one) to 1e-6,
its rollout token ids are identical at every step, and so are its final adapter (1e-6) and its generators' states.
HF rollouts; LoRA with mixed ranks (1, 8, 32) and a residual init (PiSSA: pack-mates share rank and alpha there,
the residual base being a function of them). The job-level path (pause, MLflow, files) is tests/train/test_cell_pause.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.pack_steps import cell, clean, trained
from tests.support.cell_leaves import STEPS, assert_leaves_and_comes_back_equal, build, come_back, leave


def test_a_cell_of_mixed_ranks_leaves_a_pack_and_comes_back_in_another_position(tiny_dir, tmp_path):
    """Rank 8 (alpha 4) leaves a pack beside a rank-1 member (position 1) and comes back at position 2 of a pack
    with a rank-32 member and another rank-1 member (another seed, beta, lr)."""
    from tests.support.pack_mixed_ranks import mixed_rank_cells

    r1, r8, r32 = mixed_rank_cells(tiny_dir, steps=STEPS)
    other_r1 = cell(tiny_dir, "r1b", 7, beta=0.05, lr=2e-2, rank=1, alpha=2.0, steps=STEPS)
    assert_leaves_and_comes_back_equal(r8, [r1], [r32, other_r1], first_at=1, second_at=2, tmp_path=tmp_path)


@pytest.mark.parametrize("init", ["pissa"])
def test_a_residual_init_cell_leaves_a_pack_and_comes_back_in_another_position(tiny_dir, tmp_path, init):
    """PiSSA: its residual base is rebuilt by the new pack from W0 (the same residual, the pack-mates' too)."""
    x = cell(tiny_dir, "x", 1, init=init, beta=0.05, steps=STEPS)
    y = cell(tiny_dir, "y", 2, init=init, lr=5e-3, steps=STEPS)
    z = cell(tiny_dir, "z", 3, init=init, temperature=0.7, steps=STEPS)
    assert_leaves_and_comes_back_equal(x, [y], [z], first_at=1, second_at=0, tmp_path=tmp_path)


def test_a_door_restores_the_residual_base_and_builds_the_reference_on_first_need(tiny_dir, tmp_path):
    """A door's second pack of PiSSA cells starts from W0, not from the residual the first pack wrote into the shared
    weights, and takes its KL reference (first needed by it) from W0 too: its first step equals a fresh pack's."""
    from lorarl.pack.build import Door

    door = Door()
    first = build([cell(tiny_dir, "a", 1, init="pissa", monitor=0)], tmp_path, door)
    assert door.ref is None and first.loop.ref is None  # nobody needed it yet
    first.loop.step()
    del first
    mates = [cell(tiny_dir, "b", 2, init="pissa", beta=0.05), cell(tiny_dir, "c", 3, init="pissa")]
    again, fresh = build(mates, tmp_path, door), build(mates, tmp_path)
    assert door.loads == 1 and door.ref is not None and again.loop.ref is door.ref
    a, f = again.loop.step(), fresh.loop.step()
    for name in ("b", "c"):
        assert clean(a[name]) == clean(f[name]) and again.loop.last_rollouts[name] == fresh.loop.last_rollouts[name]
    for k in range(2):
        mine, ref = trained(again, k), trained(fresh, k)
        assert all(torch.equal(mine[n], ref[n]) for n in ref)


def test_a_state_refuses_another_cells_weights(tiny_dir, tmp_path):
    """A state loads only into the cell it was saved from (its trainable weights by name and shape)."""
    from tests.support.pack_mixed_ranks import mixed_rank_cells

    r1, r8, _ = mixed_rank_cells(tiny_dir, steps=STEPS)
    pack = build([r1, r8], tmp_path)
    monitors = leave(pack, "r8", tmp_path / "s")
    with pytest.raises(ValueError, match="not this cell's trainable weights"):
        come_back(pack, "r1", tmp_path / "s", monitors)
