"""Packed cells, full steps (lorarl.pack.generate / steps / build): rollouts with per-cell RNG streams,
regime scoring, advantages, KL, update. A pack of K cells over N full steps equals K packs of one, bit for
bit on the CPU; a cell samples only from its own generator; the data order is the cell's own."""

from __future__ import annotations

import pytest
import torch

from tests.support.pack_steps import (cell, clean, fake_regimes, pack_of_k_full_steps_equals_k_packs_of_one,
                                      residual_init_cells_pack_and_equal_their_solo_runs, trained)


def test_pack_of_k_full_steps_equals_k_packs_of_one(tiny_dir, tmp_path):
    pack_of_k_full_steps_equals_k_packs_of_one(tiny_dir, tmp_path)


def test_cells_sample_from_their_own_streams(tiny_dir, tmp_path):
    """Changing one cell's seed changes its samples and data order only: the pack-mate is unaffected."""
    from lorarl.pack.build import build_pack

    one = fake_regimes(build_pack([cell(tiny_dir, "a", 1), cell(tiny_dir, "b", 2)], results_dir=tmp_path))
    two = fake_regimes(build_pack([cell(tiny_dir, "a", 1), cell(tiny_dir, "b", 9)], results_dir=tmp_path))
    r1, r2 = one.loop.step(), two.loop.step()
    assert clean(r1["a"]) == clean(r2["a"])
    assert torch.equal(one.loop.members[0].sampler.get_state(), two.loop.members[0].sampler.get_state())
    assert one.loop.members[1].order.state_dict()["perm"] != two.loop.members[1].order.state_dict()["perm"]


def test_generation_rows_end_at_eos_and_respect_the_budget(tiny_dir, tmp_path):
    from lorarl.pack.build import build_pack
    from lorarl.pack.generate import generate

    pack = build_pack([cell(tiny_dir, "a", 1), cell(tiny_dir, "b", 2)], results_dir=tmp_path)
    lp, s = pack.loop, pack.loop.sample
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    ros = generate(lp.trainer.router, [lp.members[0].prompt_ids[:3], None], gens, s)
    assert ros[1] is None and len(ros[0].completion_ids) == 3
    for c in ros[0].completion_ids:
        assert 1 <= len(c) <= s.max_new_tokens
        assert all(t not in s.eos_token_ids for t in c[:-1])  # nothing after the first EOS
    assert torch.equal(gens[1].get_state(), torch.Generator().manual_seed(1).get_state())  # b drew nothing


def test_update_in_chunks_of_cells_is_the_same_update(tiny_dir, tmp_path):
    """pack.update_cells (a memory knob): one backward per chunk of cells gives the same result, bit for bit."""
    from lorarl.pack.build import build_pack

    cells = [cell(tiny_dir, "a", 1), cell(tiny_dir, "b", 2, beta=0.05)]
    whole = fake_regimes(build_pack(cells, results_dir=tmp_path))
    chunked = fake_regimes(build_pack(cells, results_dir=tmp_path, update_cells=1))
    for _ in range(2):
        rw, rc = whole.loop.step(), chunked.loop.step()
        assert {c: clean(r) for c, r in rw.items()} == {c: clean(r) for c, r in rc.items()}
    for k in range(2):
        w, c = trained(whole, k), trained(chunked, k)
        assert all(torch.equal(w[n], c[n]) for n in w)


@pytest.mark.parametrize("method,init", [("lora", "pissa"), ("dora", "milora"), ("lora", "olora")])
def test_residual_init_cells_pack_and_equal_their_solo_runs(tiny_dir, tmp_path, method, init):
    residual_init_cells_pack_and_equal_their_solo_runs(tiny_dir, tmp_path, method, init)


def test_a_pack_refuses_members_whose_residual_bases_differ(tiny_dir, tmp_path, monkeypatch):
    """The residual is checked, not assumed: a member whose init wrote another residual is refused."""
    from lorarl.adapters import inits
    from lorarl.pack.build import build_pack

    real, seen = inits.residual, set()

    def drifting(W0, B0, A0, scale):  # the second member's residual differs (as a non-deterministic SVD would)
        out = real(W0, B0, A0, scale)
        again = id(W0) in seen  # the shared weight, written a second time: the second member
        seen.add(id(W0))
        return out + 1e-3 if again else out

    cells = [cell(tiny_dir, "a", 1, init="pissa"), cell(tiny_dir, "b", 2, init="pissa")]
    monkeypatch.setattr("lorarl.adapters.ops.residual", drifting)
    with pytest.raises(ValueError, match="cell b: its residual base differs from cell a's"):
        build_pack(cells, results_dir=tmp_path, device="cpu")
