"""lorarl.toy.kl_bound: Theorem 1's bound holds in every (rank, seed) cell, link by link; the KL
matches direct numpy / 50-digit mpmath computations; everything is deterministic given seeds."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from pydantic import ValidationError

from lorarl.language.toy import PAPER_RANKS
from lorarl.toy import kl_bound as kb

PAPER = kb.KLBoundConfig()
RANKS = PAPER_RANKS


@pytest.fixture(scope="module")
def base():
    return kb.pretrain(PAPER)


def _assert_chain(row, rtol=1e-9):
    """The proof's chain, each link separately (tolerances only for float rounding)."""
    slack = 1 + rtol
    assert 0 <= row["kl"] <= row["kl_max"] * slack
    assert row["kl_max"] <= row["dlogpi_inf"] * slack            # KL(x_e) ≤ ‖δ‖∞ ≤ Eq. (8)
    assert row["dlogpi_inf"] <= row["bound_eq8"] * slack
    assert row["dlogpi_inf"] <= row["dz_inf"] * slack             # log σ is 1-Lipschitz
    assert row["dz_inf"] <= (row["mu"] + row["mu_cross"]) * slack  # Eq. (9)-(10), exact form
    assert row["x_eval_norm_max"] <= math.sqrt(kb.K_INPUTS) * slack  # Assumption 2 made exact
    mu = row["mu"] + row["mu_cross"]
    assert row["kl_max"] <= mu * math.exp(mu) * slack


# ----------------------------------------------------------------------------- the bound
def test_bound_holds_on_reduced_grid(base):
    cfg = PAPER.model_copy(update={"epochs": 10})
    rows = kb.run_many(cfg, base, RANKS, range(3))
    assert [(r["rank"], r["seed"]) for r in rows] == [(r, s) for r in RANKS for s in range(3)]
    for row in rows:
        _assert_chain(row)
        assert row["bound"] >= row["kl_max"] >= row["kl"] > 0
        assert row["dz_inf"] <= row["mu"]  # the paper's μ alone already covers Δz here
        assert row["mu_cross"] < 1e-9 * row["mu"]  # the dropped O(η²) term is negligible


@pytest.mark.parametrize("rank", [1, 64])
def test_bound_holds_at_paper_defaults(base, rank):
    for seed in range(2):
        row = kb.run_one(PAPER, base, rank, seed)
        _assert_chain(row)
        assert row["bound"] >= row["kl_max"] >= row["kl"] > 0
        assert row["steps"] == 30 * math.ceil(len(base["y_train_N"]) / 64)
        assert row["clipped_frac"] == 1.0  # lr 1e-8 with clip 1e-3: every step is clipped
        # each clipped step moves (A, B) by ≤ lr·clip in Frobenius norm
        assert math.hypot(row["norm_dA"], row["norm_dB"]) <= row["steps"] * 1e-8 * 1e-3


def test_chain_holds_far_from_first_order_regime(base):
    """Large unclipped steps (|Δz| up to ~1): the chain still holds since no link is first-order."""
    cfg = PAPER.model_copy(update={"lr": 1e-5, "clip": None, "epochs": 1})
    rows = kb.run_many(cfg, base, RANKS, range(2))
    assert max(r["dz_inf"] for r in rows) > 0.3
    for row in rows:
        _assert_chain(row)
        assert row["bound"] >= row["kl_max"]


def test_subtract_init_starts_from_pretrained_policy(base):
    cfg = PAPER.model_copy(update={"subtract_init": True, "lr": 1e-5, "clip": None, "epochs": 1})
    out = kb.run_one(cfg, base, 4, 0, return_state=True)
    z_pre = base["X_eval_EK"].numpy() @ base["W0_DK"].numpy().T
    np.testing.assert_allclose(out["state"]["z0_eval"], z_pre, atol=1e-10)
    _assert_chain(out)


# ----------------------------------------------------------------------------- the KL
def _direct_bernoulli_kl(z0, dz):
    p, q = 1 / (1 + np.exp(-(z0 + dz))), 1 / (1 + np.exp(-z0))
    return p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))


def _mp_bernoulli_kl(z0, dz):
    with mpmath.workdps(50):
        z0, z = mpmath.mpf(z0), mpmath.mpf(z0) + mpmath.mpf(dz)
        p, q = 1 / (1 + mpmath.exp(-z)), 1 / (1 + mpmath.exp(-z0))
        return float(p * mpmath.log(p / q) + (1 - p) * mpmath.log((1 - p) / (1 - q)))


def test_bernoulli_kl_matches_direct_numpy():
    rng = np.random.default_rng(0)
    z0 = rng.uniform(-6, 6, 5000)
    dz = rng.choice([-1, 1], 5000) * 10 ** rng.uniform(-2, 0.5, 5000)
    np.testing.assert_allclose(kb.bernoulli_kl(z0, dz), _direct_bernoulli_kl(z0, dz), rtol=1e-8)


@pytest.mark.parametrize("z0", [-40.0, -8.0, -0.7, 0.0, 2.5, 15.0, 40.0])
@pytest.mark.parametrize("dz", [1e-12, -3e-9, 7e-8, -1e-5, 9.99e-4, 1.001e-3, -0.02, 0.5, -3.0])
def test_bernoulli_kl_matches_mpmath_including_tiny_and_saturated(z0, dz):
    assert kb.bernoulli_kl(z0, dz) == pytest.approx(_mp_bernoulli_kl(z0, dz), rel=1e-9, abs=0)


def test_run_kl_matches_direct_numpy_recomputation(base):
    """Rebuild both policies from (W0, A0, B0, ΔA, ΔB) and take the KL with the textbook formula
    (subtract_init keeps the logits unsaturated, where the textbook formula is accurate)."""
    cfg = PAPER.model_copy(update={"lr": 1e-4, "clip": None, "epochs": 1, "subtract_init": True})
    out = kb.run_one(cfg, base, 8, 3, return_state=True)
    st = out["state"]
    W0, Xe = base["W0_DK"].numpy(), base["X_eval_EK"].numpy()
    z0 = Xe @ W0.T
    zt = Xe @ (W0 - st["B0"] @ st["A0"] + (st["B0"] + st["dB"]) @ (st["A0"] + st["dA"])).T
    assert 0.01 < np.abs(zt - z0).max() and np.abs(z0).max() < 30
    p, q = 1 / (1 + np.exp(-zt)), 1 / (1 + np.exp(-z0))
    kl_E = (p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))).mean(axis=1)
    assert out["kl"] == pytest.approx(kl_E.mean(), rel=1e-6)
    assert out["kl_max"] == pytest.approx(kl_E.max(), rel=1e-6)
    assert out["dz_inf"] == pytest.approx(np.abs(zt - z0).max(), rel=1e-9)


def test_run_kl_at_paper_defaults_matches_mpmath(base):
    """At lr 1e-8 the textbook formula cancels to noise; check Δz by subtraction and KL in mpmath."""
    out = kb.run_one(PAPER, base, 2, 0, return_state=True)
    st = out["state"]
    W0, Xe = base["W0_DK"].numpy(), base["X_eval_EK"].numpy()
    zt = Xe @ (W0 + (st["B0"] + st["dB"]) @ (st["A0"] + st["dA"])).T
    np.testing.assert_allclose(zt - st["z0_eval"], st["dz_eval"], rtol=0, atol=1e-12)
    idx = np.random.default_rng(1).choice(st["z0_eval"].size, 300, replace=False)
    z0, dz = st["z0_eval"].ravel()[idx], st["dz_eval"].ravel()[idx]
    ref = np.array([_mp_bernoulli_kl(a, b) for a, b in zip(z0, dz)])
    np.testing.assert_allclose(kb.bernoulli_kl(z0, dz), ref, rtol=1e-9)
    assert out["kl"] == pytest.approx(kb.policy_kl(st["z0_eval"], st["dz_eval"]).mean(), rel=1e-12)


def test_lora_grads_match_autograd():
    rng = np.random.default_rng(2)
    X, Zw = rng.standard_normal((16, 64)), rng.standard_normal((16, 32))
    Y = (rng.random((16, 32)) < 0.5).astype(float)
    A, B = rng.standard_normal((4, 64)), rng.standard_normal((32, 4))
    gA, gB = kb.lora_grads(X, Zw, Y, A, B)
    At, Bt = torch.tensor(A, requires_grad=True), torch.tensor(B, requires_grad=True)
    z = torch.tensor(Zw) + torch.tensor(X) @ At.T @ Bt.T
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, torch.tensor(Y), reduction="sum") / 16
    loss.backward()
    np.testing.assert_allclose(gA, At.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gB, Bt.grad.numpy(), rtol=1e-10)


# ----------------------------------------------------------------------------- determinism, config
def test_determinism_and_cache_roundtrip(base, tmp_path):
    again = kb.pretrain(PAPER)
    assert torch.equal(again["W0_DK"], base["W0_DK"])
    assert torch.equal(again["X_eval_EK"], base["X_eval_EK"])
    path = kb.save_base(base, tmp_path / "base.pt")
    loaded = kb.load_base(path, PAPER)
    a = kb.run_one(PAPER, base, 4, 7)
    assert kb.run_one(PAPER, loaded, 4, 7) == a
    assert kb.run_many(PAPER, loaded, [4], [7]) == [a]
    assert kb.run_one(PAPER, base, 4, 8)["kl"] != a["kl"]
    with pytest.raises(ValueError, match="pretrained with"):
        kb.load_base(path, PAPER.model_copy(update={"pretrain_seed": 1}))
    other = kb.pretrain(PAPER.model_copy(update={"pretrain_seed": 1, "pretrain_iters": 5}))
    assert not torch.equal(other["X_eval_EK"], base["X_eval_EK"])


def test_base_is_a_usable_model(base):
    assert base["W0_DK"].shape == (256, 64)
    assert base["metrics"]["eval_acc"] > 0.9  # ML decoding of the digit from 256 sigmoid units
    code = base["code_CD"].numpy()
    assert ((code.min(0) == 0) & (code.max(0) == 1)).all()
    n = len(base["y_train_N"]) + len(base["y_eval_E"])
    assert n == 1797 and len(base["y_eval_E"]) == round(0.2 * 1797)


def test_ranks_are_nested_within_a_seed(base):
    cfg = PAPER.model_copy(update={"epochs": 1})
    small = kb.run_one(cfg, base, 2, 5, return_state=True)["state"]
    large = kb.run_one(cfg, base, 16, 5, return_state=True)["state"]
    np.testing.assert_array_equal(small["A0"], large["A0"][:2])
    np.testing.assert_array_equal(small["B0"], large["B0"][:, :2])
    assert small["A0"].std() == pytest.approx(1.0, abs=0.2)  # unit-variance init (Assumption 1)


def test_config_validation():
    with pytest.raises(ValidationError):
        kb.KLBoundConfig(learning_rate=1e-3)  # typo'd field names are errors
    with pytest.raises(ValidationError):
        kb.KLBoundConfig(lr=0)
    for bad in (0, 65):
        with pytest.raises(ValueError, match="rank"):
            kb.run_one(PAPER, {}, bad, 0)
    with pytest.raises(ValueError, match="rank"):
        kb.run_many(PAPER, {}, [1, 128], [0])
    assert "Output head" in kb.ASSUMPTIONS and "KL" in kb.ASSUMPTIONS
    assert all(len(line) <= 100 for line in kb.ASSUMPTIONS.splitlines())


# ----------------------------------------------------------------------------- optimiser (Fig. 1's direction)
def _seed_mean_kl(rows, rank):
    return np.mean([r["kl"] for r in rows if r["rank"] == rank])


def test_adam_kl_rises_with_rank_sgd_does_not(base):
    """The published setting: at the paper's lr 1e-8 / clip 1e-3, Adam's KL rises with rank (Fig. 1)
    while clipped SGD's does not (every step has length lr·clip whatever the rank); bound holds."""
    ranks, seeds = (1, 8, 64), range(2)
    adam = kb.run_many(PAPER.model_copy(update={"optimizer": "adam", "epochs": 5}), base, ranks, seeds)
    sgd = kb.run_many(PAPER.model_copy(update={"epochs": 5}), base, ranks, seeds)
    for row in adam + sgd:
        _assert_chain(row)
    kl_adam = [_seed_mean_kl(adam, r) for r in ranks]
    kl_sgd = [_seed_mean_kl(sgd, r) for r in ranks]
    assert kl_adam[0] < kl_adam[1] < kl_adam[2] and kl_adam[2] > 5 * kl_adam[0]
    assert not kl_sgd[2] > 2 * kl_sgd[0]
    assert kl_adam[0] > 1e4 * kl_sgd[0]  # lr 1e-8 only moves the policy visibly under Adam


def test_adam_matches_torch():
    rng = np.random.default_rng(3)
    shapes = ((3, 5), (7, 3))
    cfg = PAPER.model_copy(update={"optimizer": "adam"})
    opt = kb._Adam(cfg, shapes)
    params = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    ref = torch.optim.Adam(params, lr=1.0, betas=cfg.adam_betas, eps=cfg.adam_eps)
    mine = [np.zeros(s) for s in shapes]
    for _ in range(5):
        grads = [rng.standard_normal(s) * 1e-4 for s in shapes]
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g.copy())
        ref.step()
        for m, u in zip(mine, opt.step(grads)):
            m -= u
    for m, p in zip(mine, params):
        np.testing.assert_allclose(m, p.detach().numpy(), rtol=1e-10)
    with pytest.raises(ValidationError):
        kb.KLBoundConfig(optimizer="rmsprop")
