"""Each paper's own knobs as cell config (lorarl.language.config.TrainConfig → lorarl.train.trl_args.grpo_args → the
trainer), checked by hand on a tiny batch: PPO mini-batches per rollout batch (003 Table 2), dual-clip
(003: c = 10), sequence-level importance ratios (000 §2), advantages without the std division (000 §2),
the KL term without the pi/pi_old weight (000)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.grpo_knobs import G, build, cfg_with


def test_config_maps_to_trl_arguments(tmp_path):
    from lorarl.train.trl_args import grpo_args

    a = grpo_args(cfg_with(prompts_per_step=8, mini_batch_prompts=2, num_iterations=2, dual_clip=10.0,
                           importance_sampling_level="sequence"), tmp_path, use_cpu=True)
    assert (a.steps_per_generation, a.per_device_train_batch_size, a.generation_batch_size) == (4, 2 * G, 8 * G)
    assert (a.delta, a.importance_sampling_level) == (10.0, "sequence")
    plain = grpo_args(cfg_with(), tmp_path, use_cpu=True)
    assert (plain.steps_per_generation, plain.per_device_train_batch_size, plain.delta) == (1, 2 * G, None)
    with pytest.raises(ValueError, match="mini_batch_prompts .3. must divide train.prompts_per_step .8."):
        cfg_with(prompts_per_step=8, mini_batch_prompts=3)
    with pytest.raises(ValueError, match="dual_clip must exceed 1"):
        cfg_with(dual_clip=1.1, epsilon_high=0.28)


def _fixed_batch(trainer, ds, log_ratio, adv):
    """One generated batch with the old log-probs moved so that log(pi/pi_old) = ``log_ratio`` [B, T]
    (or a scalar) and the advantages set to ``adv`` [B]."""
    trainer.model.train()
    out = trainer._generate_and_score_completions([dict(ds[i]) for i in range(2) for _ in range(G)])
    mask = out["completion_mask"].float()
    with torch.no_grad():
        logp = trainer._forward_logps(trainer.model, out)
    lr = torch.as_tensor(log_ratio, dtype=torch.float32).expand_as(logp)
    out["old_per_token_logps"] = (logp - lr).detach()
    out["advantages"] = torch.as_tensor(adv, dtype=torch.float32)[:, None].expand_as(logp) * mask
    return out, mask


def test_dual_clip_caps_the_loss_of_negative_advantages_at_c(tiny_dir, tmp_path):
    losses = {}
    for c in (None, 10.0):
        trainer, ds = build(tiny_dir, tmp_path, cfg_with(dual_clip=c))
        torch.manual_seed(0)
        batch, mask = _fixed_batch(trainer, ds, math.log(20.0), [-1.0] * (2 * G))  # ratio 20 > c
        trainer.current_gradient_accumulation_steps = 1
        losses[c] = trainer.compute_loss(trainer.model, batch).item()
    # grpo loss: -min(r A, clip(r) A) per token = r |A| = 20 without dual-clip, min(r, c) |A| = 10 with it
    assert losses[None] == pytest.approx(20.0, rel=1e-4)
    assert losses[10.0] == pytest.approx(10.0, rel=1e-4)


def test_sequence_level_ratio_is_the_exp_of_the_mean_token_log_ratio(tiny_dir, tmp_path):
    trainer, ds = build(tiny_dir, tmp_path, cfg_with(importance_sampling_level="sequence", epsilon=0.5))
    torch.manual_seed(0)
    probe, _ = _fixed_batch(trainer, ds, 0.0, [1.0] * (2 * G))
    T = probe["completion_ids"].size(1)
    log_ratio = 0.1 * torch.sin(torch.arange(2 * G * T, dtype=torch.float32)).view(2 * G, T)  # |.| <= 0.1
    torch.manual_seed(0)
    batch, mask = _fixed_batch(trainer, ds, log_ratio, [1.0] * (2 * G))
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, batch).item()
    seq_ratio = torch.exp((log_ratio * mask).sum(-1) / mask.sum(-1))  # inside the clip range: unclipped
    assert loss == pytest.approx(-seq_ratio.mean().item(), rel=1e-5)
    tok_ratio = ((torch.exp(log_ratio) * mask).sum(-1) / mask.sum(-1)).mean().item()
    assert abs(tok_ratio - seq_ratio.mean().item()) > 1e-5  # the token level would give another loss


def test_advantage_without_std_and_kl_without_the_ratio_weight(tiny_dir, tmp_path):
    from lorarl.numerics import kl as klmod

    trainer, ds = build(tiny_dir, tmp_path, cfg_with(scale_rewards="none", kl_importance_correction=False),
                        scores=(1.0, 0.0, 0.5, 0.5))
    torch.manual_seed(0)
    trainer.model.train()
    out = trainer._generate_and_score_completions([dict(ds[i]) for i in range(2) for _ in range(G)])
    adv = out["advantages"][:, 0]  # r - group mean, not divided by the std (paper 000 §2)
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert trainer.kl_importance_correction is False
    logp = torch.tensor([[-1.0, -2.0]]); old = torch.tensor([[-1.5, -1.0]]); m = torch.ones(1, 2)
    assert klmod.importance_weight(logp, old, m, "token").tolist()[0] == pytest.approx([math.exp(0.5), math.exp(-1)])
    assert klmod.importance_weight(logp, old, m, "sequence").tolist()[0] == pytest.approx([math.exp(-0.25)])


@pytest.mark.parametrize("dynamic", [False, True])
def test_mini_batches_take_several_optimiser_steps_per_rollout_batch(tiny_dir, tmp_path, dynamic):
    """003 Table 2: one rollout batch of P prompts, P / mini_batch optimiser steps on it (train.steps counts
    rollout batches); with DAPO's refill the rollout batch keeps its P groups, so the mini-batches stay whole."""
    cfg = cfg_with(steps=2, prompts_per_step=2, mini_batch_prompts=1, dynamic_sampling=dynamic)
    trainer, _ = build(tiny_dir, tmp_path, cfg, scores=(1.0, 1.0, 0.0, 1.0) if dynamic else (1.0, 0.0, 0.0, 1.0))
    calls = []
    real = trainer._generate_and_score_completions

    def counted(inputs):
        calls.append(len(inputs))
        return real(inputs)

    trainer._generate_and_score_completions = counted
    scored = []
    real_round = trainer._score_round

    def round_counted(inputs, mode):
        scored.append(len(inputs))
        return real_round(inputs, mode)

    trainer._score_round = round_counted
    trainer.train()
    assert trainer.state.global_step == 4
    assert calls == [2 * G, 2 * G]  # two rollout batches of 2 prompts, each split into 2 mini-batches
    # group 0 of every round degenerate: one refill round (P new prompts) per rollout batch
    assert scored == ([2 * G] * 4 if dynamic else [2 * G] * 2)
