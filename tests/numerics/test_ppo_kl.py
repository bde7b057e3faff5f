"""verl's `actor/ppo_kl` as a per-update training metric (paper 003 trains on verl; its Figs. 5-6 read the KL
between the rollout policy and the current one): the mean over a mini-batch's response tokens of
log π_old − log π, taken in the loss forward before that mini-batch's update, the log-ratio clamped to
[-20, 20] (verl's compute_policy_loss: `ppo_kl = masked_mean(-negative_approx_kl, response_mask)`)."""

from __future__ import annotations

import pytest
import torch

from lorarl.numerics import kl as klmod


def test_ppo_kl_by_hand():
    new = torch.tensor([[-1.0, -2.0, -30.0], [-0.5, -0.5, 0.0]])
    old = torch.tensor([[-1.5, -1.0, -5.0], [-0.5, -1.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    per = klmod.ppo_kl(new, old)
    assert per.flatten().tolist() == pytest.approx([-0.5, 1.0, 20.0, 0.0, -1.0, 0.0])  # old − new, clamped at 20
    assert float(klmod.masked_mean(per, mask)) == pytest.approx((-0.5 + 1.0 + 20.0 + 0.0 - 1.0) / 5)


def test_ppo_kl_is_logged_per_update_before_it(tiny_dir, tmp_path):
    """Two mini-batch updates in one training step: the first sees the rollout policy itself (0), the second the
    policy after the first update, on its own rows, against the rollout policy's log-probs (nonzero)."""
    from tests.support.grpo_knobs import build, cfg_with

    trainer, _ = build(tiny_dir, tmp_path, cfg_with(steps=1, prompts_per_step=2, mini_batch_prompts=1, lr=0.05))
    real = trainer._compute_loss
    want = []

    def spy(model, inputs):
        mask = inputs["completion_mask"]
        now = trainer._forward_logps(trainer.model, inputs)  # the policy before this update
        old = inputs.get("old_per_token_logps")
        old = now if old is None else old
        want.append(float(((old - now) * mask).sum() / mask.sum()))
        return real(model, inputs)

    trainer._compute_loss = spy
    trainer.train()
    got = [h["ppo_kl"] for h in trainer.state.log_history if "ppo_kl" in h]
    assert len(want) == 2 and want[0] == pytest.approx(0.0, abs=1e-6) and abs(want[1]) > 1e-3
    # one row per training step (lorarl.train.trl_args logs per rollout batch): the mean over its updates, as
    # verl's step metrics are the mean over the step's mini-batches
    assert got == [pytest.approx(sum(want) / 2, rel=1e-3)]


def test_packed_cell_loss_reports_the_same_ppo_kl():
    """A packed cell (lorarl.pack.loss) logs ppo_kl under the solo trainer's name and definition."""
    from lorarl.pack.loss import LossSettings, cell_loss

    new = torch.tensor([[-1.0, -2.0, -0.3], [-0.5, -0.7, -0.1]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.0, -0.2], [-0.5, -1.5, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    _, stats = cell_loss(LossSettings(), new, {"completion_mask": mask, "advantages": torch.tensor([1.0, -1.0]),
                                               "old_per_token_logps": old})
    assert stats["ppo_kl"] == pytest.approx(float(klmod.masked_mean(klmod.ppo_kl(new.detach(), old), mask)))
    assert stats["ppo_kl"] == pytest.approx((-0.5 + 1.0 + 0.1 + 0.0 - 0.8) / 5)
    # TRL's clip_ratio/*: row 0 (advantage +1) has one ratio e^0.5 > 1.2 (clipped high), e^-1 < 0.8 is not
    # clipped (positive advantage); row 1 (advantage -1): e^0.8 is above, not below, so nothing clipped low
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 5) and stats["clip_ratio/low_mean"] == 0.0
    assert stats["clip_ratio/region_mean"] == pytest.approx(1 / 5)
    assert stats["clip_ratio/high_max"] == pytest.approx(1 / 3) and stats["clip_ratio/low_min"] == 0.0
    _, low = cell_loss(LossSettings(), new, {"completion_mask": mask, "advantages": torch.tensor([-1.0, -1.0]),
                                             "old_per_token_logps": old})
    assert low["clip_ratio/low_mean"] == pytest.approx(1 / 5) and low["clip_ratio/low_min"] == 0.0  # row 1: none
