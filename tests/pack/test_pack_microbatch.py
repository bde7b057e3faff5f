"""Micro-batched packed updates (``train.micro_batch_size`` in a pack, lorarl.pack.trainer): each member's
loss and gradients with chunks of 1, 2 and 3 rows (uneven last chunk) equal its unbatched update's, for
every loss type x advantage shape x KL setting x ratio level; checkpointing the shared base gives the
gradients of no checkpointing (the backward recomputes the ROUTED forward); chunked log-probs (policy and
reference) equal unchunked; full packed steps built from the members' settings end at the same adapters."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lorarl.pack.loss import LossSettings
from lorarl.pack.tiled import LOGIT_TOKENS
from lorarl.pack.trainer import PackCell, PackedTrainer
from tests.support.grpo import MAXLEN, load
from tests.support.pack import init_adapter, peft_config, synthetic_batch

LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
REGIMES = ("outcome", "process", "distillation")
KL = [(0.0, "k3", True), (0.1, "k1", True), (0.1, "k3", True), (0.1, "k3", False), (0.1, "one_sided", True)]
LEVELS = ("token", "sequence")
SEEDS = (1, 2)


def _cells(tiny_dir):
    from peft import get_peft_model

    cells = []
    for s in SEEDS:
        m, tok = load(tiny_dir)
        torch.manual_seed(s)
        pm = get_peft_model(m, peft_config("lora"))
        init_adapter(pm, "lora", seed=s)
        opt = torch.optim.SGD([p for p in pm.parameters() if p.requires_grad], lr=0.0)  # grads only, no move
        cells.append(PackCell(f"s{s}", pm, opt, LossSettings(max_completion_length=MAXLEN), max_grad_norm=None))
    return cells, tok


def _advantages(regime, mask_BT, seed):
    B, T = mask_BT.shape
    g = torch.Generator().manual_seed(seed)
    if regime == "outcome":
        return torch.randn(B, 1, generator=g).expand(B, T) * mask_BT
    if regime == "process":
        steps_BT = torch.cumsum((torch.rand(B, T, generator=g) < 0.3).float(), dim=1)
        return torch.sin(steps_BT + torch.arange(B)[:, None]) * mask_BT
    return torch.randn(B, T, generator=g) * mask_BT


@pytest.fixture(scope="module")
def pack(tiny_dir):
    cells, tok = _cells(tiny_dir)
    ref, _ = load(tiny_dir)
    trainer = PackedTrainer(cells, pad_token_id=tok.pad_token_id, fused_lm_head=False)
    batches = []
    for k, s in enumerate(SEEDS):
        b = synthetic_batch(s, 0, ref, tok, ref.config.vocab_size)
        b = {key: torch.cat([v, v[:1]]) if isinstance(v, torch.Tensor) else v for key, v in b.items()}  # 5 rows
        batches.append(b)
    with torch.no_grad():
        for k, lp in enumerate(trainer.logps(batches, [0, 1])):
            wiggle_BT = 0.3 * torch.sin(torch.arange(lp.numel(), dtype=torch.float32) + k).view_as(lp)
            batches[k]["old_per_token_logps"] = (lp - wiggle_BT).detach()  # ratios on both sides of the clip
    yield trainer, batches
    trainer.router.remove()


def _grads(trainer, batches, m):
    trainer.micro_batch_size = m
    metrics = trainer.step(batches)
    trainer.micro_batch_size = None
    g = [{n: p.grad.detach().clone() for n, p in c.model.named_parameters() if p.requires_grad and p.grad is not None}
         for c in trainer.cells]
    return [metrics[c.name] for c in trainer.cells], g


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("beta,estimator,corrected", KL)
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("loss_type", LOSSES)
def test_packed_micro_batches_give_each_members_unbatched_update(pack, loss_type, regime, beta, estimator,
                                                                 corrected, level):
    trainer, batches = pack
    for k, c in enumerate(trainer.cells):
        c.loss = dataclasses.replace(c.loss, loss_type=loss_type, beta=beta if k else 0.0, kl_estimator=estimator,
                                     kl_importance_correction=corrected, importance_sampling_level=level,
                                     delta=3.0, epsilon_high=0.28)
        batches[k]["advantages"] = _advantages(regime, batches[k]["completion_mask"].float(), 7 + k)
    whole, g_whole = _grads(trainer, batches, None)
    assert all(g for g in g_whole)
    for m in (1, 2, 3):  # 5 rows: chunks 2+2+1 and 3+2
        got, g = _grads(trainer, batches, m)
        for k in range(len(SEEDS)):  # the step's metrics (loss, grad_norm, kl) are the unbatched step's
            assert got[k].keys() == whole[k].keys() and {"loss", "grad_norm"} <= got[k].keys()
            assert got[k] == pytest.approx(whole[k], abs=1e-6, rel=1e-6), (m, k, got[k], whole[k])
        for k in range(len(SEEDS)):
            assert g[k].keys() == g_whole[k].keys()
            for n in g[k]:
                torch.testing.assert_close(g[k][n], g_whole[k][n], atol=1e-6, rtol=1e-5, msg=f"m={m} cell {k} {n}")


@pytest.mark.parametrize("loss_type", LOSSES)
def test_packed_token_budgets_give_each_members_unbatched_update(pack, loss_type):
    """``train.micro_batch_tokens`` in a pack: each member's rows sorted by length and chunked by positions
    (every row alone, a medium budget, the whole batch); KL on for one member, per-sequence ratios."""
    from lorarl.train.tokenbudget import row_lengths

    trainer, batches = pack
    for k, c in enumerate(trainer.cells):
        c.loss = dataclasses.replace(c.loss, loss_type=loss_type, beta=0.1 * k, importance_sampling_level="sequence",
                                     delta=3.0, epsilon_high=0.28)
        batches[k]["advantages"] = _advantages("distillation", batches[k]["completion_mask"].float(), 5 + k)
    whole, g_whole = _grads(trainer, batches, None)
    logps_whole = dict(trainer.last_logps)
    widest = max(max(row_lengths(b)) for b in batches)
    for budget in (1, 2 * widest, 5 * widest):
        trainer.micro_batch_tokens = budget
        try:
            got, g = _grads(trainer, batches, None)
            chunked = trainer.logps_chunked(batches, [0, 1])
        finally:
            trainer.micro_batch_tokens = None
        for k in range(len(SEEDS)):
            assert got[k] == pytest.approx(whole[k], abs=1e-6, rel=1e-6), (budget, k, got[k], whole[k])
            mask = batches[k]["completion_mask"].bool()
            torch.testing.assert_close(trainer.last_logps[k][mask], logps_whole[k][mask], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(chunked[k][mask], logps_whole[k][mask], atol=1e-6, rtol=1e-6)
            for n in g[k]:
                torch.testing.assert_close(g[k][n], g_whole[k][n], atol=1e-6, rtol=1e-6, msg=f"{budget} cell {k} {n}")


def test_chunked_policy_log_probs_equal_unchunked(pack):
    trainer, batches = pack
    with torch.no_grad():
        whole = trainer.logps(batches, [0, 1])
        for m in (1, 3):
            trainer.micro_batch_size = m
            chunked = trainer.logps_chunked(batches, [0, 1])
            trainer.micro_batch_size = None
            for a, b in zip(chunked, whole):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_checkpointing_the_shared_base_gives_the_same_gradients(pack):
    from lorarl.pack.build import _checkpoint_base

    trainer, batches = pack
    for k, c in enumerate(trainer.cells):
        c.loss = dataclasses.replace(c.loss, loss_type="grpo", beta=0.1 * k)
        batches[k]["advantages"] = _advantages("distillation", batches[k]["completion_mask"].float(), 3 + k)
    _, off = _grads(trainer, batches, 2)
    _checkpoint_base(trainer.host)
    base = trainer.host.get_base_model()
    try:
        assert base.is_gradient_checkpointing
        _, on = _grads(trainer, batches, 2)
    finally:
        base.gradient_checkpointing_disable()
    for k in range(len(SEEDS)):
        for n in off[k]:
            torch.testing.assert_close(on[k][n], off[k][n], atol=1e-6, rtol=1e-5, msg=f"cell {k} {n}")


def test_pack_micro_batch_is_the_smallest_members():
    from types import SimpleNamespace

    from lorarl.language.config import CellConfig
    from lorarl.pack.build import pack_micro_batch

    def cell(mb):
        return SimpleNamespace(config=CellConfig.model_validate({"train": {"micro_batch_size": mb}}))

    assert pack_micro_batch([cell(4), cell(2), cell(None)]) == 2
    assert pack_micro_batch([cell(None), cell("auto")]) is None
    from lorarl.pack.build import pack_micro_tokens

    def budget(n):
        return SimpleNamespace(config=CellConfig.model_validate({"train": {"micro_batch_tokens": n}}))

    assert pack_micro_tokens([budget(512), budget(None), budget(256)]) == 256
    assert pack_micro_tokens([budget(None), cell(2)]) is None


def _method_config(method):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
                      use_dora=method == "dora", use_rslora=method == "rslora")


@pytest.mark.parametrize("method", ["dora", "rslora"])  # lora: test_checkpointing_the_shared_base_gives_...
def test_checkpointing_every_packable_method_recomputes_and_keeps_gradients(tiny_dir, method):
    """Each PEFT method a pack takes (lorarl.pack.plan.PACKABLE_METHODS): the checkpointed backward re-runs
    the decoder layers (counted) and gives each member the gradients of no checkpointing."""
    from peft import get_peft_model

    from lorarl.pack.build import _checkpoint_base
    from lorarl.pack.plan import PACKABLE_METHODS

    assert set(PACKABLE_METHODS) == {"lora", "dora", "rslora"}  # a new method needs its row here
    cells = []
    for s in SEEDS:
        m, tok = load(tiny_dir)
        torch.manual_seed(s)
        pm = get_peft_model(m, _method_config(method))
        init_adapter(pm, "lora", seed=s)
        opt = torch.optim.SGD([p for p in pm.parameters() if p.requires_grad], lr=0.0)
        cells.append(PackCell(f"s{s}", pm, opt, LossSettings(max_completion_length=MAXLEN, beta=0.1),
                              max_grad_norm=None))
    trainer = PackedTrainer(cells, pad_token_id=tok.pad_token_id, fused_lm_head=False)
    batches = [synthetic_batch(s, 1, cells[0].model.get_base_model(), tok, cells[0].model.config.vocab_size)
               for s in SEEDS]
    layer = trainer.host.get_base_model().model.layers[0]
    calls = []
    hook = layer.register_forward_pre_hook(lambda *a: calls.append(1))  # (a recompute stops early)
    try:
        _, off = _grads(trainer, batches, 3)
        n_off = len(calls)
        _checkpoint_base(trainer.host)
        calls.clear()
        _, on = _grads(trainer, batches, 3)
        assert len(calls) == 2 * n_off  # every chunk's forward is recomputed in its backward
    finally:
        hook.remove()
        trainer.host.get_base_model().gradient_checkpointing_disable()
        trainer.router.remove()
    for k in range(len(SEEDS)):
        assert off[k] and off[k].keys() == on[k].keys()
        for n in off[k]:
            torch.testing.assert_close(on[k][n], off[k][n], atol=1e-6, rtol=1e-5, msg=f"{method} cell {k} {n}")


def test_chunked_reference_log_probs_equal_unchunked(pack):
    """The pack's frozen-reference forward (PackLoop._ref_logps) at micro_batch_size rows per cell per
    forward (chunks straddling cells, each cell at its own temperature) equals one forward."""
    from lorarl.pack.generate import SampleSettings
    from lorarl.pack.steps import DataOrder, Member, PackLoop

    trainer, batches = pack
    W = max(b["prompt_ids"].size(1) for b in batches)
    padded = {}
    for k, b in enumerate(batches):
        p = W - b["prompt_ids"].size(1)
        padded[k] = {**b, "prompt_ids": torch.nn.functional.pad(b["prompt_ids"], (p, 0), value=0),
                     "prompt_mask": torch.nn.functional.pad(b["prompt_mask"], (p, 0), value=0)}
    members = [Member(name=c.name, regime=None, prompts=[], prompt_ids=[], answers=[], order=DataOrder(1, 0),
                      sampler=torch.Generator(), steps=1, prompts_per_step=1, generations=1, beta=0.1)
               for c in trainer.cells]
    sample = SampleSettings(prompt_width=W, max_new_tokens=MAXLEN, temperature=(1.0, 0.7))
    loop = PackLoop(trainer, members, sample, tokenizer=None, ref_model=trainer.host.get_base_model())
    whole = loop._ref_logps(padded)
    assert whole[0].shape == batches[0]["completion_ids"].shape
    assert all(bool((lp < 0).all()) for lp in whole.values())  # real log-probs of a 300-token vocabulary
    for m, tokens in ((1, None), (2, None), (3, None), (None, 7), (2, 3)):  # rows; tokens of logits per tile
        trainer.micro_batch_size = m
        trainer.logit_tokens = tokens or trainer.logit_tokens
        try:
            chunked = loop._ref_logps(padded)
        finally:
            trainer.micro_batch_size, trainer.logit_tokens = None, LOGIT_TOKENS
        for k in whole:
            torch.testing.assert_close(chunked[k], whole[k], atol=1e-6, rtol=1e-6, msg=f"m={m} {tokens} cell {k}")


def test_full_packed_steps_with_micro_batches_and_checkpointing_end_at_the_same_adapters(tiny_dir, tmp_path):
    """build_pack reads the members' train.micro_batch_size (the smallest) and gradient_checkpointing: three
    full steps (rollouts; an outcome member, and a process member with beta > 0 and KL monitors every step;
    update) with micro-batch 3 of 4 rows and the base checkpointed give the metrics and adapters of the
    whole-batch pack without checkpointing."""
    from lorarl.pack.build import build_pack
    from tests.support.pack_steps import cell, clean, fake_regimes, trained

    def cells(**train):
        out = [cell(tiny_dir, "a", 1), cell(tiny_dir, "b", 2, beta=0.05, regime="process", monitor=1)]
        for c in out:
            c.config = c.config.model_copy(update={"train": c.config.train.model_copy(update=train)})
        return out

    whole = fake_regimes(build_pack(cells(), results_dir=tmp_path))
    small = cells(gradient_checkpointing="on")
    small[0].config.train.micro_batch_size = 3
    micro = fake_regimes(build_pack(small, results_dir=tmp_path))
    assert micro.loop.trainer.micro_batch_size == 3 and whole.loop.trainer.micro_batch_size is None
    assert micro.loop.trainer.host.get_base_model().is_gradient_checkpointing
    assert not whole.loop.trainer.host.get_base_model().is_gradient_checkpointing
    for _ in range(3):
        rw, rm = whole.loop.step(), micro.loop.step()
        assert rw.keys() == rm.keys() == {"a", "b"}
        for name in rw:
            assert clean(rm[name]) == pytest.approx(clean(rw[name]), abs=1e-5, rel=1e-5), name
    for k in range(2):
        w, m = trained(whole, k), trained(micro, k)
        for n in w:
            torch.testing.assert_close(m[n], w[n], atol=1e-5, rtol=1e-5, msg=f"cell {k} {n}")


@pytest.mark.parametrize("tokens", [1, 7, 23])  # tiles of 1 column, of 1 column over 5 rows... and uneven tiles
def test_log_probs_tiled_over_tokens_equal_the_whole_sequence_and_keep_gradients(pack, tokens):
    """lorarl.pack.tiled: vocabulary logits a tile of tokens at a time (checkpointed under grad) give the
    whole-sequence log-probs and, through the update, the same gradients; the reference forward too."""
    trainer, batches = pack
    for k, c in enumerate(trainer.cells):
        c.loss = dataclasses.replace(c.loss, loss_type="bnpo", beta=0.1 * k, importance_sampling_level="token")
        batches[k]["advantages"] = _advantages("process", batches[k]["completion_mask"].float(), 5 + k)
    trainer.logit_tokens = 10 ** 9  # one tile: the whole-sequence path
    with torch.no_grad():
        whole_lp = trainer.logps(batches, [0, 1])
    whole, g_whole = _grads(trainer, batches, 3)
    trainer.logit_tokens = tokens
    try:
        import lorarl.pack.tiled as tiled

        calls = []
        real = tiled._tile
        tiled._tile = lambda *a: calls.append(1) or real(*a)
        try:
            with torch.no_grad():
                lp = trainer.logps(batches, [0, 1])
        finally:
            tiled._tile = real
        assert len(calls) > 1  # really tiled
        got, g = _grads(trainer, batches, 3)
    finally:
        trainer.logit_tokens = LOGIT_TOKENS
    for a, b in zip(lp, whole_lp):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    for k in range(len(SEEDS)):
        assert got[k] == pytest.approx(whole[k], abs=1e-6, rel=1e-6)
        for n in g_whole[k]:
            torch.testing.assert_close(g[k][n], g_whole[k][n], atol=1e-6, rtol=1e-5, msg=f"cell {k} {n}")
