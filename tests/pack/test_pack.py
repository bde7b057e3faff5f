"""Packed cells (lorarl.pack): equivalence with the solo TRL-based trainer, and K-pack vs K=1 runs.

(1) For the same batches, each packed cell's loss and gradients equal LorarlGRPOTrainer's (the solo,
    TRL-based trainer) to <= 1e-6 in fp32: outcome and process regimes, beta = 0 and beta > 0, LoRA,
    DoRA and an orthonormal init (DCT rows), cells with different prompts (different padding).
(2) A pack of K cells trained for N steps equals K packed trainers with K = 1 to float32 rounding (CPU): bit
    for bit where the CPU's matrix kernels are batch-invariant (AVX-512 machines), within a few ulps where they
    block a K-cell batch differently from a one-cell batch (AVX2: up to 5e-7 on parameters of size ~1).
"""

from __future__ import annotations

import pytest
import torch

from lorarl.train.trainer import LorarlGRPOTrainer
from lorarl.pack.loss import LossSettings
from lorarl.pack.trainer import PackCell, PackedTrainer
from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.rewards.process import ProcessDeposits, RuleStepChecker
from tests.support.grpo import G, MAXLEN, P, args, dataset, fake_score, load
from tests.support.pack import _cell, init_adapter, peft_config, synthetic_batch

K = 3
# what the loss logs (TRL's and lorarl's, per update): a packed cell's must equal the solo trainer's
LOSS_STATS = ("ppo_kl", "entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
              "clip_ratio/low_min", "clip_ratio/high_max")


def regime(name, tok):
    return OutcomeDeposits(score_fn=fake_score) if name == "outcome" else ProcessDeposits(RuleStepChecker(),
                                                                                          tokenizer=tok)


def solo_cells(tiny_dir, tmp_path, kind, reg, betas, temps=None):
    """K solo trainers (own adapters, own prompts), each with one scored batch."""
    out = []
    for k, beta in enumerate(betas):
        m, tok = load(tiny_dir)
        a = args(tmp_path / str(k), loss_type="grpo", epsilon_high=0.28, bf16=False,  # fp32: no CPU autocast
                 temperature=(temps or [1.0] * len(betas))[k])
        torch.manual_seed(k)
        t = LorarlGRPOTrainer(model=m, regime=regime(reg, tok), args=a, kl_beta=beta, train_dataset=dataset(),
                              processing_class=tok, peft_config=peft_config(kind), ref_model="auto")
        init_adapter(t.model, kind, seed=10 + k)
        t.current_gradient_accumulation_steps = 1
        rows = [{"prompt": "Q: " + "1" * (k + 1) + f"{i}+2=?\nA: ", "answer": "3"} for i in range(P)]
        torch.manual_seed(100 + k)
        t.model.train()
        batch = t._generate_and_score_completions([dict(r) for r in rows for _ in range(G)])
        out.append((t, batch))
    return out


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("kind,reg,temps", [("lora", "outcome", None), ("dora", "outcome", None),
                                            ("dct", "outcome", None), ("lora", "process", None),
                                            ("lora", "outcome", [1.0, 0.7])])
def test_packed_loss_and_grads_equal_solo_trainer(tiny_dir, tmp_path, kind, reg, temps):
    betas = [0.0, 0.05]  # beta = 0 and beta > 0 inside one pack
    cells = solo_cells(tiny_dir, tmp_path, kind, reg, betas, temps)
    widths = {b["prompt_ids"].size(1) for _, b in cells}
    assert len(widths) > 1  # the cells really are padded to a common width inside the pack
    solo = []
    for t, b in cells:
        t.model.zero_grad()
        loss = t.compute_loss(t.model, b)
        loss.backward()
        solo.append((loss.item(), grads(t.model), {n: v[-1] for n, v in t._metrics["train"].items() if n in LOSS_STATS}))
    assert any(g.abs().max() > 0 for g in solo[1][1].values())  # beta > 0: the KL term always has a gradient
    pcs = [PackCell(f"c{k}", t.model, torch.optim.SGD(t.model.parameters(), lr=0.0),
                    LossSettings(loss_type="grpo", beta=beta, epsilon_high=0.28, max_completion_length=MAXLEN))
           for k, ((t, _), beta) in enumerate(zip(cells, betas))]
    pack = PackedTrainer(pcs, pad_token_id=cells[0][0]._tokenizer.pad_token_id,  # temperatures per cell: unfused head
                         **({"temperature": temps, "fused_lm_head": False} if temps else {}))
    for c in pcs:
        c.model.zero_grad()
    losses = pack.losses([b for _, b in cells])
    sum(loss for loss, _ in losses.values()).backward()
    for k, (loss_s, grads_s, stats_s) in enumerate(solo):
        assert abs(losses[k][0].item() - loss_s) <= 1e-6
        assert set(stats_s) == set(LOSS_STATS) - ({"kl"} if betas[k] == 0 else set()), stats_s  # what TRL logged
        for n, v in stats_s.items():  # the loss's metrics under the solo trainer's names and definitions
            assert losses[k][1][n] == pytest.approx(v, abs=1e-5), (k, n)
        g = grads(pcs[k].model)
        assert g.keys() == grads_s.keys() and g
        worst = max((g[n] - grads_s[n]).abs().max().item() for n in g)
        assert worst <= 1e-6, (k, worst)
    pack.router.remove()


def make_pack_cells(tiny_dir, n, seeds, kind="lora"):
    """Cells built from the base with PEFT directly (no trainer): model, AdamW, a linear schedule."""
    from peft import get_peft_model

    out = []
    for s in seeds:
        m, tok = load(tiny_dir)
        torch.manual_seed(s)  # the cell's own init stream (lora_A)
        pm = get_peft_model(m, peft_config(kind))
        init_adapter(pm, kind, seed=s)
        opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / (n + 1))
        out.append(PackCell(f"s{s}", pm, opt, LossSettings(beta=0.05 * (s % 2), max_completion_length=MAXLEN),
                            sched, max_grad_norm=0.5))
    return out, tok


ROUNDING = 2e-6  # absolute, on parameters of size ~1: a few float32 ulps, far below one update (lr 1e-2)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to float32 rounding of a different batch blocking (bit for bit on batch-invariant kernels)."""
    return torch.allclose(a, b, rtol=0, atol=ROUNDING)


def test_pack_of_k_equals_k_packs_of_one_to_rounding(tiny_dir):
    n_steps, seeds = 3, [1, 2, 3, 4]
    ref, tok = load(tiny_dir)
    vocab = ref.config.vocab_size
    batches = [[synthetic_batch(s, i, ref, tok, vocab) for s in seeds] for i in range(n_steps)]
    cells, _ = make_pack_cells(tiny_dir, n_steps, seeds)
    start = [{n: p.detach().clone() for n, p in c.model.named_parameters() if p.requires_grad} for c in cells]
    pack = PackedTrainer(cells, pad_token_id=tok.pad_token_id, fused_lm_head=False)
    for i in range(n_steps):
        m = pack.step(batches[i])
        assert set(m) == {c.name for c in cells}
    for k, s in enumerate(seeds):
        (solo,), _ = make_pack_cells(tiny_dir, n_steps, [s])
        one = PackedTrainer([solo], pad_token_id=tok.pad_token_id, fused_lm_head=False)
        for i in range(n_steps):
            one.step([batches[i][k]])
        mine = dict(cells[k].model.named_parameters())
        trained = {n: p for n, p in solo.model.named_parameters() if p.requires_grad}
        assert trained.keys() == start[k].keys()
        assert all(same(p, mine[n]) for n, p in trained.items()), s  # float32 rounding (bit for bit on AVX-512)
        assert any((p - start[k][n]).abs().max() > 1000 * ROUNDING for n, p in trained.items())  # and it did train
        assert solo.scheduler.get_last_lr() == cells[k].scheduler.get_last_lr()


def test_nan_cell_is_stopped_and_the_others_go_on(tiny_dir):
    seeds = [1, 2, 3]
    ref, tok = load(tiny_dir)
    vocab = ref.config.vocab_size
    cells, _ = make_pack_cells(tiny_dir, 2, seeds)
    pack = PackedTrainer(cells, pad_token_id=tok.pad_token_id, fused_lm_head=False)
    b = [synthetic_batch(s, 0, ref, tok, vocab) for s in seeds]
    b[1]["advantages"] = b[1]["advantages"] * float("nan")
    before = {n: p.detach().clone() for n, p in cells[1].model.named_parameters() if p.requires_grad}
    m = pack.step(b)
    assert m["s2"]["diverged"] == 1.0 and cells[1].state == "diverged" and cells[1].diverged_at == 1
    assert all(torch.equal(p, before[n]) for n, p in cells[1].model.named_parameters() if p.requires_grad)
    assert pack.running() == [0, 2]
    # the healthy cells got the update they get without the NaN cell in the pack (to float32 rounding)
    alone, _ = make_pack_cells(tiny_dir, 2, [1, 3])
    PackedTrainer(alone, pad_token_id=tok.pad_token_id, fused_lm_head=False).step([b[0], b[2]])
    for c, a in zip([cells[0], cells[2]], alone):
        pa = dict(a.model.named_parameters())
        assert all(same(p, pa[n]) for n, p in c.model.named_parameters() if p.requires_grad)
        assert all(torch.isfinite(p).all() for p in c.model.parameters())
    m2 = pack.step([synthetic_batch(s, 1, ref, tok, vocab) for s in seeds])
    assert set(m2) == {"s1", "s3"}


def test_router_rejects_cells_with_different_bases(tiny_dir):
    from peft import get_peft_model

    a, _ = load(tiny_dir)
    b, _ = load(tiny_dir)
    with torch.no_grad():
        next(p for n, p in b.named_parameters() if "q_proj" in n).add_(1.0)
    from lorarl.pack.routing import Router

    with pytest.raises(ValueError, match="frozen base weight"):
        Router([get_peft_model(a, peft_config("lora")), get_peft_model(b, peft_config("lora"))])


def test_plan_groups_by_compatibility_key():
    from lorarl.pack.plan import pack_key, plan_packs

    cells = [_cell("a", train__beta=0.0), _cell("b", train__beta=0.05, train__lr=1e-2), _cell("c", adapter__init="gaussian"),
             _cell("d", reward__regime="process"), _cell("e", adapter__dropout=0.05),
             _cell("f", adapter__method="ia3", adapter__rank=None, adapter__alpha=None, adapter__dropout=None),
             _cell("g", train__temperature=0.7), _cell("h")]
    assert pack_key(cells[0].config) == pack_key(cells[1].config) == pack_key(cells[3].config)
    assert pack_key(cells[4].config) is None and pack_key(cells[5].config) is None
    assert pack_key(cells[6].config) == pack_key(cells[0].config)  # temperature may differ inside a pack
    assert plan_packs(cells, 4) == [["a", "b", "d", "g"], ["c"], ["e"], ["f"], ["h"]]
    assert plan_packs(cells, 2) == [["a", "b"], ["c"], ["d", "g"], ["e"], ["f"], ["h"]]
    assert plan_packs(cells, 1) == [[c.id] for c in cells]
    with pytest.raises(ValueError, match="pack.max_cells"):
        plan_packs(cells, 0)


def test_cli_cells_packs(capsys):
    from lorarl.cli import main

    assert main(["cells", "experiments/demo.yaml", "--packs", "--max-cells", "4"]) == 0
    out = capsys.readouterr().out
    assert "pack 0: r1-kl0-s0 r1-kl0-s1 r1-kl0.05-s0 r1-kl0.05-s1" in out and "2 packs for 8 cells" in out
    assert main(["cells", "experiments/demo.yaml", "--packs", "--max-cells", "0"]) == 2
    assert "pack.max_cells must be an integer >= 1" in capsys.readouterr().err


def test_cells_the_packed_loop_cannot_train_run_solo():
    from lorarl.pack.plan import pack_key

    assert pack_key(_cell("a").config) is not None
    assert pack_key(_cell("p", adapter__init="pissa").config) is not None  # residual inits pack (test_pack_steps)
    for over in ({"train__num_iterations": 2}, {"train__dynamic_sampling": True},
                 {"train__mini_batch_prompts": 4}):
        assert pack_key(_cell("x", **over).config) is None, over


def test_vllm_cells_pack_when_vllm_serves_their_adapters_as_loras():
    """rollout.engine: vllm cells pack (one multi-LoRA engine per pack, lorarl.pack.vllm_rollouts); vLLM serves LoRA
    and rsLoRA adapters, not DoRA (its cells sample from merged weights, solo); vLLM and HF cells never share a pack."""
    from lorarl.pack.plan import pack_key, plan_packs

    for method in ("lora", "rslora"):
        lo = _cell("a", rollout__engine="vllm", adapter__method=method, adapter__rank=1, adapter__alpha=2)
        hi = _cell("b", rollout__engine="vllm", adapter__method=method, adapter__rank=32, train__beta=0.05)
        assert pack_key(lo.config) is not None and pack_key(lo.config) == pack_key(hi.config), method
        assert pack_key(lo.config) != pack_key(_cell("h", adapter__method=method).config)
    assert pack_key(_cell("d", rollout__engine="vllm", adapter__method="dora").config) is None
    cells = [_cell(c, rollout__engine="vllm", adapter__rank=r) for c, r in (("a", 1), ("b", 8), ("c", 32))]
    assert plan_packs(cells + [_cell("h")], 4, breakeven=None) == [["a", "b", "c"], ["h"]]  # the measured table's
    # pack-or-solo rule on top: tests/pack/test_pack_breakeven.py


def test_pack_setting_parsing():
    from lorarl.pack.plan import max_cells, update_cells

    assert [max_cells(v) for v in (None, False, 0, 1, 4, {"max_cells": 3})] == [1, 1, 1, 1, 4, 3]
    assert [update_cells(v) for v in (4, {"max_cells": 3}, {"max_cells": 3, "update_cells": 1})] == [0, 0, 1]
    with pytest.raises(ValueError, match="update_cells"):
        update_cells({"max_cells": 3, "update_cells": -1})
    for bad in (-1, "4", 2.5, {"max_cells": 0}, {"size": 2}):
        with pytest.raises(ValueError, match="max_cells"):
            max_cells(bad)


def test_a_pack_jobs_id_is_distinct_by_kind():
    """A resident job never takes the id (and so the record, ledger and log) of an earlier fixed pack of the same
    cells, nor a rung's pack a whole one's: the kind is in the hashed text, where no cell id can put it."""
    import re

    from lorarl.pack.plan import pack_id

    ids = ["r1-s0", "r8-s0"]
    kinds = [pack_id(ids), pack_id(ids, until=2), pack_id(ids, resident=True), pack_id(ids, until=2, resident=True)]
    assert len(set(kinds)) == 4 and all(re.fullmatch(r"pack-[0-9a-f]{10}", k) for k in kinds)
    assert kinds[0] == pack_id(list(ids)) != pack_id(ids[::-1])  # the members, in order


def test_pack_settings_name_the_field_and_the_allowed_values():
    from lorarl.pack.plan import gpu_memory_gb, max_cells

    with pytest.raises(ValueError, match=r"unknown key\(s\) pack\.place \(did you mean pack\.places\?\); allowed: "
                                         r"pack\.max_cells, .*pack\.gpu_memory_gb"):
        max_cells({"resident": True, "place": 2})
    assert gpu_memory_gb({"resident": True, "places": 2}) is None and gpu_memory_gb({"gpu_memory_gb": "80"}) == 80.0
    for bad in (0, -1, "lots", True):
        with pytest.raises(ValueError, match="pack.gpu_memory_gb must be a number of GiB > 0.*allowed: a number > 0"):
            gpu_memory_gb({"gpu_memory_gb": bad})
