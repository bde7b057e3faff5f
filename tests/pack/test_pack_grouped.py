"""Grouped adapter terms (lorarl.pack.routing.grouped_terms): the plain LoRA cells of a layer that share a rank and
a row count take their terms in one pair of batched matmuls. Against one cell at a time (PEFT's own F.linear) a
routed forward and its gradients agree to 1e-6 (mixed ranks, a DoRA cell and an empty cell fall back or join
as they should); a grouped pack of K full steps equals K grouped packs of one bit for bit, residual inits and
mixed ranks included; the default is grouped on a GPU, one cell at a time on a CPU, $LORARL_PACK_GROUPED overrides."""

from __future__ import annotations

import pytest
import torch

from tests.support.grpo import load


@pytest.fixture
def grouped_calls(monkeypatch):
    """Counts the grouped forwards (so a test knows the grouped path ran)."""
    from lorarl.pack import routing

    calls = {"n": 0}
    real = routing.grouped_terms

    def counting(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(routing, "grouped_terms", counting)
    return calls


def _models(tiny_dir, specs):
    """PEFT models on one base per (method, rank, alpha), each with its own seeded, non-zero lora_B."""
    from peft import LoraConfig, get_peft_model

    out = []
    for i, (method, r, alpha) in enumerate(specs):
        base, _ = load(tiny_dir)
        torch.manual_seed(i)
        m = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, use_dora=method == "dora",
                                            target_modules=["q_proj", "v_proj", "up_proj"]))
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        out.append(m)
    return out


@pytest.mark.parametrize("sizes", [[3, 3, 3, 3], [3, 0, 3, 2]])
def test_grouped_routing_equals_one_cell_at_a_time(tiny_dir, sizes):
    from lorarl.pack.routing import Router

    specs = [("lora", 4, 8), ("lora", 4, 16), ("lora", 2, 4), ("dora", 4, 8)]  # two share a rank; mixed; a variant
    out = {}
    for grouped in (False, True):
        models = _models(tiny_dir, specs)
        router = Router(models, grouped=grouped)
        ids_NL = torch.randint(3, 40, (sum(sizes), 6), generator=torch.Generator().manual_seed(0))
        with router.route(sizes):
            logits = router.host(input_ids=ids_NL).logits
        logits.float().pow(2).mean().backward()
        grads = {(k, n): p.grad.clone() for k, m in enumerate(models) for n, p in m.named_parameters()
                 if p.requires_grad and p.grad is not None}
        out[grouped] = (logits.detach(), grads)
    (l0, g0), (l1, g1) = out[False], out[True]
    assert torch.allclose(l0, l1, atol=1e-6, rtol=0)
    assert g0.keys() == g1.keys() and len(g0) > 0
    assert all(torch.allclose(g0[k], g1[k], atol=1e-6, rtol=1e-5) for k in g0)
    assert any(float(g.abs().max()) > 0 for (k, n), g in g1.items() if k == 2 and "lora_A" in n)  # the rank-2 cell
    empty = [k for k, n in enumerate(sizes) if n == 0]
    assert all(k not in empty for k, _ in g1 if g1[(k, _)].abs().max() > 0)  # an empty cell gets no gradient


def test_grouped_is_the_gpu_default_and_the_variable_overrides(monkeypatch):
    from lorarl.pack.routing import GROUPED_ENV, grouped_default

    monkeypatch.delenv(GROUPED_ENV, raising=False)
    assert grouped_default("cpu") is False and grouped_default("cuda") is True and grouped_default(None) is False
    monkeypatch.setenv(GROUPED_ENV, "1")
    assert grouped_default("cpu") is True
    monkeypatch.setenv(GROUPED_ENV, "0")
    assert grouped_default("cuda") is False
    monkeypatch.setenv(GROUPED_ENV, "yes")
    with pytest.raises(ValueError, match="LORARL_PACK_GROUPED must be 1 or 0"):
        grouped_default("cpu")


def test_a_grouped_pack_of_k_equals_k_grouped_packs_of_one(tiny_dir, tmp_path, monkeypatch, grouped_calls):
    """The packs' bit-for-bit contract (tests/pack/test_pack_steps.py), grouped: 3 cells of one rank over 3 full steps."""
    from lorarl.pack.routing import GROUPED_ENV
    from tests.support.pack_steps import pack_of_k_full_steps_equals_k_packs_of_one

    monkeypatch.setenv(GROUPED_ENV, "1")
    pack_of_k_full_steps_equals_k_packs_of_one(tiny_dir, tmp_path)
    assert grouped_calls["n"] > 0


def test_grouped_residual_init_and_mixed_rank_packs_equal_their_solo_runs(tiny_dir, tmp_path, monkeypatch,
                                                                          grouped_calls):
    from lorarl.pack.routing import GROUPED_ENV
    from tests.support.pack_mixed_ranks import assert_pack_equals_solo, mixed_rank_cells
    from tests.support.pack_steps import residual_init_cells_pack_and_equal_their_solo_runs

    monkeypatch.setenv(GROUPED_ENV, "1")
    residual_init_cells_pack_and_equal_their_solo_runs(tiny_dir, tmp_path / "pissa", "lora", "pissa")
    assert_pack_equals_solo(mixed_rank_cells(tiny_dir, method="lora"), tmp_path / "ranks", steps=3, tol=1e-6)
    assert grouped_calls["n"] > 0
