"""KL estimators and TRL-equivalent aggregation of a per-token penalty."""

from __future__ import annotations

import math

import pytest
import torch

from lorarl.numerics import kl


def test_estimators_by_hand():
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.4)]])
    assert kl.k1(logp, ref)[0].tolist() == pytest.approx([math.log(2), math.log(0.5)])
    # k3 = exp(r) - r - 1 with r = log ref - log p = log 0.5, log 2
    assert kl.k3(logp, ref)[0].tolist() == pytest.approx([0.5 - math.log(0.5) - 1, 2 - math.log(2) - 1])
    # one-sided: max(p * (log p - log ref), 0): 0.5*log 2 and max(0.2*log 0.5, 0) = 0
    assert kl.one_sided(logp, ref)[0].tolist() == pytest.approx([0.5 * math.log(2), 0.0])


def test_k1_and_k3_are_unbiased_for_the_exact_kl():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(6), 0)
    q = torch.softmax(torch.randn(6), 0)
    exact = (p * (p.log() - q.log())).sum()
    lp, lq = p.log(), q.log()
    assert (p * kl.k1(lp, lq)).sum() == pytest.approx(exact.item(), abs=1e-6)
    assert (p * kl.k3(lp, lq)).sum() == pytest.approx(exact.item(), abs=1e-6)


def test_importance_weight_multiplies():
    logp, ref = torch.zeros(1, 2), torch.full((1, 2), -1.0)
    w = torch.tensor([[2.0, 3.0]])
    assert torch.equal(kl.per_token_kl("k1", logp, ref, w), torch.tensor([[2.0, 3.0]]))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl.per_token_kl("k2", logp, ref)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_aggregate_matches_trl_normalisers(loss_type):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    got = kl.aggregate(x, m, loss_type, max_completion_length=5, num_items_in_batch=torch.tensor(6),
                       grad_accum=2, steps_per_generation=2)
    want = {"grpo": ((3 / 2 + 4 / 1) / 2) / 2, "bnpo": (7 / 3) / 2, "dr_grpo": (7 / (2 * 5)) / 2,
            "dapo": 7 / (6 * 2 / 2)}[loss_type]
    assert got.item() == pytest.approx(want)


def test_aggregate_rejects_other_losses():
    with pytest.raises(ValueError, match="supports"):
        kl.aggregate(torch.zeros(1, 1), torch.ones(1, 1), "cispo")
