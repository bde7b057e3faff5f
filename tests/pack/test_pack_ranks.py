"""Mixed ranks in one pack: cells that differ in adapter rank and alpha share a pack (the key drops them unless
the init rewrites the base), the router applies each member's own LoRA layers and scaling, and a multi-LoRA
engine's max_lora_rank is the largest member's. Members of ranks 1, 8 and 32 packed = alone to 1e-6, with HF
rollouts and with vLLM multi-LoRA rollouts (tests/support/fake_vllm.py; the harness is tests/support/pack_mixed_ranks.py)."""

from __future__ import annotations

import pytest

from tests.support import fake_vllm
from tests.support.pack_mixed_ranks import (MIXED_RANKS, assert_multilora_pack_equals_solo, assert_pack_equals_solo,
                                    mixed_rank_cells, save_mixed_rank_adapters)
from tests.support.grpo import load
from tests.support.pack import _cell


def test_rank_and_alpha_leave_the_key_unless_the_init_rewrites_the_base():
    from lorarl.pack.plan import pack_key, plan_packs

    for over in ({}, {"adapter__init": "gaussian"}, {"adapter__method": "dora"}, {"adapter__method": "rslora"},
                 {"adapter__init": "dct"}, {"adapter__init": "rlpo"}):
        lo, hi = _cell("a", adapter__rank=1, adapter__alpha=2, **over), _cell("b", adapter__rank=32, adapter__alpha=64, **over)
        assert pack_key(lo.config) is not None and pack_key(lo.config) == pack_key(hi.config), over
    for init in ("pissa", "milora", "olora", "olora_tail"):  # W0 - s·B0A0 depends on rank and alpha: one pack each
        r4, r8 = _cell("a", adapter__rank=4, adapter__init=init), _cell("b", adapter__rank=8, adapter__init=init)
        a16 = _cell("c", adapter__rank=4, adapter__alpha=8, adapter__init=init)
        assert len({pack_key(r4.config), pack_key(r8.config), pack_key(a16.config)}) == 3, init
    # still apart: another method, init or target set
    base = _cell("a")
    for over in ({"adapter__method": "dora"}, {"adapter__init": "gaussian"}, {"adapter__target_modules": ["q_proj"]}):
        assert pack_key(_cell("x", **over).config) != pack_key(base.config), over
    ranks = [_cell(f"r{r}", adapter__rank=r, adapter__alpha=2 * r) for r in (1, 4, 16, 64)]
    assert plan_packs(ranks, 4) == [["r1", "r4", "r16", "r64"]]


@pytest.mark.parametrize("method", ["lora", "dora"])
def test_members_of_ranks_1_8_32_train_as_alone_with_hf_rollouts(tiny_dir, tmp_path, method):
    """One pack of ranks 1, 8 and 32 (alphas 2, 4, 64; seeds, β, lr and temperature differing too) over 3 full
    steps: each member's adapter, metrics and RNG streams equal its solo run's to 1e-6."""
    from lorarl.pack.build import build_pack
    from lorarl.pack.routing import lora_layers

    cells = mixed_rank_cells(tiny_dir, method=method)
    pack = build_pack(cells, results_dir=tmp_path, device="cpu")  # one pack (refused before: rank was in the key)
    ranks = [{lay.lora_A["default"].weight.shape[0] for lay in lora_layers(c.model).values()}
             for c in pack.loop.trainer.cells]
    assert ranks == [{r} for r, _ in MIXED_RANKS]
    scalings = [{lay.scaling["default"] for lay in lora_layers(c.model).values()} for c in pack.loop.trainer.cells]
    assert scalings == [{a / r} for r, a in MIXED_RANKS]  # each member's own alpha/r in the router
    rows = assert_pack_equals_solo(cells, tmp_path, steps=3, tol=1e-6)
    assert len(rows) == 3 and all(set(r) == {c.id for c in cells} for r in rows)


def test_multilora_engine_serves_ranks_1_8_32_with_the_largest_rank(tiny_dir, tmp_path, monkeypatch):
    """vLLM multi-LoRA rollouts of a mixed-rank pack: the engine's max_lora_rank is the largest member rank (32),
    and every member's samples in one call equal its samples alone (tokens, logprobs to 1e-6)."""
    from lorarl.pack.multilora import engine_lora_kwargs, saved_engine_lora_kwargs
    from tests.support.multilora import settings

    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)
    api = fake_vllm.api()
    _, tok = load(tiny_dir)
    names, dirs = save_mixed_rank_adapters(tiny_dir, tmp_path)
    kw = saved_engine_lora_kwargs(names, dirs)
    assert kw == {"enable_lora": True, "max_loras": 3, "max_lora_rank": 32, "max_cpu_loras": 6}
    assert engine_lora_kwargs([1])["max_lora_rank"] == 1 and engine_lora_kwargs([1, 8])["max_lora_rank"] == 8
    llm = api.LLM(str(tiny_dir), **kw)
    prompts = [tok("Q: 1+2=?\nA: ")["input_ids"], tok("Q: 3+4=?\nA: ")["input_ids"]]
    packed = assert_multilora_pack_equals_solo(api, llm, names, dirs, prompts, settings(tok), generations=2, tol=1e-6)
    assert llm.generate_calls == 1 + len(names)  # the pack's one call, then each member alone
    assert len({tuple(map(tuple, (t for t, _ in packed[k]))) for k in packed}) == 3  # each its own adapter
    fake_vllm.fresh_process()  # an engine sized for the smaller members refuses the rank-32 one
    small = api.LLM(str(tiny_dir), **engine_lora_kwargs([1, 8]))
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        assert_multilora_pack_equals_solo(api, small, names, dirs, prompts, settings(tok))
