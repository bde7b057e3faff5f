"""Deposits → advantages: the one rule, hand-computed 2-prompt x 2-completion examples per regime,
and the reduction of the outcome regime to TRL's GRPO advantage."""

from __future__ import annotations

import math

import pytest
import torch

from lorarl.train.advantages import ADV_EPS, advantages_from_deposits, group_normalize, reward_to_go
from lorarl.rewards import Deposits


def _mask(lengths, T):
    return torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def _adv(dep: Deposits, lengths, T, G=2, scale=True):
    row, pos, val = dep.flat()
    return advantages_from_deposits(row, pos, val, _mask(lengths, T), G, dense=dep.dense, scale=scale)


def trl_advantages(rewards_B: torch.Tensor, G: int) -> torch.Tensor:
    """TRL 1.16's scalar GRPO advantage (sum_then_normalize, scale_rewards='group')."""
    from trl.trainer.utils import nanstd

    mean = torch.nanmean(rewards_B.view(-1, G), dim=1).repeat_interleave(G)
    std = nanstd(rewards_B.view(-1, G), dim=1).repeat_interleave(G)
    return (rewards_B - mean) / (std + 1e-4)


def test_outcome_2x2_by_hand():
    # prompt 0: completions of length 3 and 2, rewards 1, 0; prompt 1: lengths 1 and 3, rewards 1, 1
    dep = Deposits([[2], [1], [0], [2]], [[1.0], [0.0], [1.0], [1.0]])
    a = _adv(dep, [3, 2, 1, 3], T=3)
    s = 1 / math.sqrt(2)  # Bessel std of {1, 0}
    hi, lo = 0.5 / (s + ADV_EPS), -0.5 / (s + ADV_EPS)
    expected = torch.tensor([[hi, hi, hi], [lo, lo, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(a.adv_BT, expected, atol=1e-6)
    assert a.stats.degenerate_P.tolist() == [False, True]  # prompt 1: all rewards equal


def test_process_2x2_by_hand():
    # step scores per completion (deposits on each step's closing token), lengths 4,4,3,3
    dep = Deposits([[1, 3], [3], [0, 1, 2], [2]], [[1.0, 0.0], [1.0], [1.0, 1.0, 0.0], [0.0]])
    a = _adv(dep, [4, 4, 3, 3], T=4)
    # group 0 deposits {1, 0, 1}: mean 2/3, Bessel std sqrt(1/3)
    m0, s0 = 2 / 3, math.sqrt(1 / 3)
    n = lambda r, m, s: (r - m) / (s + ADV_EPS)  # noqa: E731
    r0 = [n(1, m0, s0), n(0, m0, s0)]  # deposits at positions 1 and 3 of completion 0
    # reward-to-go: t<=1 sees both, t in {2,3} sees only the last
    c0 = [r0[0] + r0[1], r0[0] + r0[1], r0[1], r0[1]]
    c1 = [n(1, m0, s0)] * 4
    # group 1 deposits {1, 1, 0, 0}: mean 0.5, Bessel std sqrt(1/3)
    m1, s1 = 0.5, math.sqrt(1 / 3)
    d = [n(1, m1, s1), n(1, m1, s1), n(0, m1, s1)]
    c2 = [d[0] + d[1] + d[2], d[1] + d[2], d[2], 0.0]  # position 3 is padding
    c3 = [n(0, m1, s1)] * 3 + [0.0]
    assert torch.allclose(a.adv_BT, torch.tensor([c0, c1, c2, c3]), atol=1e-5)
    assert a.stats.count_P.tolist() == [3, 4]


def test_distillation_2x2_by_hand():
    # dense: one deposit per token (log pi_T - log pi_theta), lengths 2,1,2,2
    vals = [[-1.0, 0.0], [1.0], [0.5, 0.5], [0.5, -1.5]]
    dep = Deposits([list(range(len(v))) for v in vals], vals, dense=True)
    a = _adv(dep, [2, 1, 2, 2], T=2)
    g0 = torch.tensor([-1.0, 0.0, 1.0])
    g1 = torch.tensor([0.5, 0.5, 0.5, -1.5])
    z0 = (g0 - g0.mean()) / (g0.std() + ADV_EPS)
    z1 = (g1 - g1.mean()) / (g1.std() + ADV_EPS)
    expected = torch.tensor([[z0[0], z0[1]], [z0[2], 0.0], [z1[0], z1[1]], [z1[2], z1[3]]])
    assert torch.allclose(a.adv_BT, expected, atol=1e-6)  # used directly: no reverse cumsum


def test_outcome_equals_trl_advantage_on_every_token():
    torch.manual_seed(0)
    B, G, T = 12, 4, 7
    rewards = torch.randint(0, 2, (B,)).float()
    rewards[:4] = torch.tensor([0.0, 1.0, 1.0, 0.5])
    lengths = torch.randint(1, T + 1, (B,)).tolist()
    dep = Deposits([[n - 1] for n in lengths], [[float(r)] for r in rewards])
    a = _adv(dep, lengths, T, G=G)
    expected = trl_advantages(rewards, G).unsqueeze(1) * _mask(lengths, T)
    assert torch.equal(a.adv_BT, expected)  # bit-identical


def test_scale_none_only_centres():
    dep = Deposits([[0], [0]], [[3.0], [1.0]])
    a = _adv(dep, [1, 1], T=1, scale=False)
    assert a.adv_BT.squeeze(1).tolist() == [1.0, -1.0]


def test_dense_must_cover_every_token():
    dep = Deposits([[0], [0]], [[1.0], [0.0]], dense=True)
    with pytest.raises(ValueError, match="every completion token"):
        _adv(dep, [2, 1], T=2)


def test_shared_positions_add_and_bounds_checked():
    row, pos, val = torch.tensor([0, 0, 1]), torch.tensor([1, 1, 0]), torch.tensor([1.0, 2.0, 0.0])
    a = advantages_from_deposits(row, pos, val, _mask([2, 2], 2), 2, dense=False, scale=False)
    assert a.ndep_BT[0, 1].item() == pytest.approx((1 - 1) + (2 - 1))
    with pytest.raises(ValueError, match="outside"):
        advantages_from_deposits(row, torch.tensor([5, 0, 0]), val, _mask([2, 2], 2), 2, dense=False)


def test_single_deposit_group_has_zero_std_and_zero_advantage():
    norm, stats = group_normalize(torch.tensor([0]), torch.tensor([5.0]), 2, 2)
    assert norm.tolist() == [0.0] and stats.std_P.tolist() == [0.0]


def test_reward_to_go():
    x = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    assert reward_to_go(x).tolist() == [[3.0, 2.0, 2.0, 0.0]]


def test_group_size_must_divide():
    with pytest.raises(ValueError, match="groups"):
        group_normalize(torch.tensor([0]), torch.tensor([1.0]), 3, 2)
