"""lorarl.diagnose.weights: each metric against an independent numpy/scipy computation and on
constructed matrices whose answer is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.linalg import subspace_angles
from scipy.stats import ortho_group

from lorarl.diagnose import weights as dg
from tests.support.diagnose_reference import reference_rows

SHAPES = [(40, 40), (48, 24), (24, 48)]  # square, tall (D > N), wide (D < N)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _with_spectrum(D, N, sigma, seed=0):
    """W = U diag(sigma) Vᵀ with Haar-random U (D×M), V (N×M); returns W, U, V."""
    M = min(D, N)
    U = ortho_group.rvs(D, random_state=seed)[:, :M]
    V = ortho_group.rvs(N, random_state=seed + 1)[:, :M]
    return (U * np.asarray(sigma)) @ V.T, U, V


def _distinct_sigma(M):
    return np.linspace(10.0, 1.0, M)


# --------------------------------------------------------------------------- spectral drift
@pytest.mark.parametrize("shape", SHAPES)
def test_spectral_drift_matches_numpy(shape):
    rng = _rng(1)
    W0 = rng.standard_normal(shape)
    W1 = W0 + 0.3 * rng.standard_normal(shape)
    s0, s1 = np.linalg.svd(W0, compute_uv=False), np.linalg.svd(W1, compute_uv=False)
    expect = np.linalg.norm(s1 - s0) / np.linalg.norm(s0)
    assert dg.spectral_drift(torch.tensor(W0), torch.tensor(W1)) == pytest.approx(expect, rel=1e-10)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transform, expect", [
    ("left_rotation", 0.0),   # W+ = Q W0: same singular values
    ("right_rotation", 0.0),  # W+ = W0 Rᵀ
    ("both_rotations", 0.0),
    ("double", 1.0),          # W+ = 2 W0: every σ doubles, NSS = 1
    ("negate", 0.0),          # sign flip is a rotation too
])
def test_spectral_drift_known_answers(shape, transform, expect):
    D, N = shape
    W0 = _rng(2).standard_normal(shape)
    Q, R = ortho_group.rvs(D, random_state=3), ortho_group.rvs(N, random_state=4)
    W1 = {"left_rotation": Q @ W0, "right_rotation": W0 @ R.T, "both_rotations": Q @ W0 @ R.T,
          "double": 2 * W0, "negate": -W0}[transform]
    assert dg.spectral_drift(torch.tensor(W0, dtype=torch.float32), W1) == pytest.approx(expect, abs=1e-6)


# --------------------------------------------------------------------------- principal angles
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k, noise", [(1, 0.05), (4, 1e-6), (8, 0.2), (16, 1.0)])
def test_principal_angles_match_scipy(shape, k, noise):
    rng = _rng(5)
    W0 = rng.standard_normal(shape)
    W1 = W0 + noise * rng.standard_normal(shape)
    U0, _, V0h = np.linalg.svd(W0, full_matrices=False)
    U1, _, V1h = np.linalg.svd(W1, full_matrices=False)
    out = dg.principal_angles(torch.tensor(W0), torch.tensor(W1), k)
    for side, (A, B) in {"left": (U0[:, :k], U1[:, :k]), "right": (V0h[:k].T, V1h[:k].T)}.items():
        theta = subspace_angles(A, B)  # descending angles
        np.testing.assert_allclose(out[f"cos_{side}_K"].numpy(), np.sort(np.cos(theta))[::-1], atol=1e-10)
        assert out[f"max_angle_{side}_deg"] == pytest.approx(np.degrees(theta.max()), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("theta", [1e-7, 0.01, 0.3, math.pi / 2])
def test_principal_angles_planted_rotation(theta):
    """W+ = G W0 with G rotating u_1 towards u_{k+1} by θ: top-k left angle is θ, right is 0."""
    D, N, k = 30, 20, 5
    W0, U, _ = _with_spectrum(D, N, _distinct_sigma(20), seed=7)
    u1, uk1 = U[:, 0], U[:, k]
    G = (np.eye(D) + (math.cos(theta) - 1) * (np.outer(u1, u1) + np.outer(uk1, uk1))
         + math.sin(theta) * (np.outer(uk1, u1) - np.outer(u1, uk1)))
    out = dg.principal_angles(torch.tensor(W0), torch.tensor(G @ W0), k)
    assert math.radians(out["max_angle_left_deg"]) == pytest.approx(theta, rel=1e-6)
    assert out["max_angle_right_deg"] == pytest.approx(0.0, abs=1e-6)
    assert dg.spectral_drift(W0, G @ W0) == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(out["cos_left_K"].numpy()[:-1], 1.0, atol=1e-12)
    assert out["cos_left_K"][-1].item() == pytest.approx(math.cos(theta), abs=1e-12)


# --------------------------------------------------------------------------- SVD-aligned update
@pytest.mark.parametrize("shape", SHAPES)
def test_svd_aligned_update_matches_loop(shape):
    rng = _rng(8)
    W0, dW = rng.standard_normal(shape), 0.1 * rng.standard_normal(shape)
    U, _, Vh = np.linalg.svd(W0, full_matrices=False)
    c = np.array([abs(U[:, i] @ dW @ Vh[i]) for i in range(U.shape[1])])
    out = dg.svd_aligned_update(torch.tensor(W0), torch.tensor(dW))
    np.testing.assert_allclose(out["c_M"].numpy(), c, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(out["p_M"].numpy(), c / c.sum(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(out["cum_energy_M"].numpy(), np.cumsum(c**2) / np.sum(c**2), rtol=1e-10)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("r", [1, 3, 8])
def test_update_inside_top_r_has_all_energy_in_first_r_modes(shape, r):
    D, N = shape
    W0, U, V = _with_spectrum(D, N, _distinct_sigma(min(D, N)), seed=9)
    X = _rng(10).standard_normal((r, r)) + 3 * np.eye(r)  # full r×r block, off-diagonals too
    dW = U[:, :r] @ X @ V[:, :r].T
    out = dg.svd_aligned_update(W0, dW)
    assert out["c_M"][r:].abs().max().item() < 1e-12
    assert out["p_M"][:r].sum().item() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(out["cum_energy_M"][r - 1:].numpy(), 1.0, atol=1e-12)
    np.testing.assert_allclose(out["c_M"][:r].numpy(), np.abs(np.diag(X)), rtol=1e-9)


def test_svd_aligned_update_zero_update_is_nan():
    out = dg.svd_aligned_update(torch.eye(4), torch.zeros(4, 4))
    assert torch.all(out["c_M"] == 0) and torch.isnan(out["p_M"]).all()


# --------------------------------------------------------------------------- subspace similarity
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("r", [1, 4])
def test_subspace_similarity(shape, r):
    D, N = shape
    W0, _, V = _with_spectrum(D, N, _distinct_sigma(min(D, N)), seed=11)
    A = _rng(12).standard_normal((r, N))
    Vt, Vb = V[:, :r], V[:, -r:]
    out = dg.subspace_similarity(torch.tensor(A), torch.tensor(W0))
    assert out["sim_top"] == pytest.approx(np.linalg.norm(A @ Vt) / np.linalg.norm(A), rel=1e-10)
    assert out["sim_bottom"] == pytest.approx(np.linalg.norm(A @ Vb) / np.linalg.norm(A), rel=1e-10)
    mix = _rng(13).standard_normal((r, r))
    top = dg.subspace_similarity(mix @ Vt.T, W0)  # rows of A span the top-r right subspace
    bottom = dg.subspace_similarity(mix @ Vb.T, W0)
    assert top["sim_top"] == pytest.approx(1.0, abs=1e-12) and top["sim_bottom"] < 1e-12
    assert bottom["sim_bottom"] == pytest.approx(1.0, abs=1e-12) and bottom["sim_top"] < 1e-12


def test_subspace_similarity_random_a_expectation():
    W0 = _rng(14).standard_normal((64, 256))
    svd0 = dg.svd(W0)  # W0's SVD once, as the diagnose job reuses it across adapters
    vals = [dg.subspace_similarity(_rng(s).standard_normal((8, 256)), W0, svd0=svd0)["sim_top"] ** 2
            for s in range(200)]
    assert np.mean(vals) == pytest.approx(8 / 256, rel=0.1)


# --------------------------------------------------------------------------- bf16 probe
def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy()


def _probe_pairs(n=20000, seed=15):
    """Weights across many binades (subnormals, zeros, both signs), perturbed by 0..~4 bf16 ULPs."""
    rng = _rng(seed)
    w0 = rng.choice([-1, 1], n) * 2.0 ** rng.uniform(-130, 20, n)
    w0[:50] = 0.0
    w1 = w0 * (1 + rng.choice([0, 0, 1e-4, 2e-3, 5e-3, 1e-2, 3e-2], n))
    w1[50:60] = 1e-3  # zero -> nonzero
    return w0.astype(np.float32), w1.astype(np.float32)


@pytest.mark.parametrize("eta", [0.0, 1e-12, 1e-3, 2.0**-8 * 0.999])
def test_bf16_probe_equals_bitwise_equality_for_eta_below_2_pow_minus_8(eta):
    w0, w1 = _probe_pairs()
    changed = dg.bf16_changed_mask(torch.tensor(w0), torch.tensor(w1), eta).numpy()
    b0, b1 = _bf16_bits(w0), _bf16_bits(w1)
    both_zero = ((b0 & 0x7FFF) == 0) & ((b1 & 0x7FFF) == 0)  # +0 and -0 are equal values
    bitwise_differ = (b0 != b1) & ~both_zero
    assert 0.2 < changed.mean() < 0.8  # the pairs exercise both outcomes
    np.testing.assert_array_equal(changed, bitwise_differ)
    assert dg.bf16_update_sparsity(w0, w1, eta) == pytest.approx(1 - bitwise_differ.mean(), abs=1e-12)


def test_bf16_probe_coarser_eta_ignores_small_changes():
    w0, w1 = _probe_pairs()
    assert dg.bf16_update_sparsity(w0, w1, 1e-2) > dg.bf16_update_sparsity(w0, w1, 1e-3)


@pytest.mark.parametrize("w0, w1, changed", [
    (1024.001, 1024.002, False),  # same bf16 code although |Δ| = 1e-3 > 1e-5 (App. E.1)
    (1e-6, 2e-6, True),           # ~134 ULPs apart although |Δ| < 1e-5 (App. E.1)
    (0.0, 0.0, False),
    (0.0, -0.0, False),           # equal values, different sign bit
    (1.0, 1.0 + 2.0**-7, True),   # exactly one bf16 ULP (7 stored mantissa bits) at 1.0
    (1.0, 1.0 + 2.0**-9, False),  # rounds back to 1.0
    (1.99, 1.99 * (1 + 2.0**-8), True),  # near the top of a binade a ULP is ~2⁻⁸ relative
])
def test_bf16_probe_examples(w0, w1, changed):
    assert bool(dg.bf16_changed_mask(torch.tensor([w0]), torch.tensor([w1]))[0]) is changed


def test_bf16_sparsity_counts_changed_entries():
    W0 = _rng(16).standard_normal((50, 40)).astype(np.float32)
    W1 = W0.copy()
    W1.flat[:123] *= 1.5
    assert dg.bf16_update_sparsity(W0, W1) == pytest.approx(1 - 123 / 2000)


# --------------------------------------------------------------------------- masks and overlap
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.05, 0.5, 1.0])
def test_mask_density(shape, alpha):
    W0 = _rng(17).standard_normal(shape)
    n = W0.size
    for m in (dg.principal_mask(W0, 4, alpha), dg.low_magnitude_mask(W0, alpha)):
        assert m.dtype == torch.bool and tuple(m.shape) == shape
        assert int(m.sum()) == round(alpha * n)


@pytest.mark.parametrize("k", [1, 3, 24])
def test_principal_mask_matches_numpy_reconstruction(k):
    W0 = _rng(18).standard_normal((24, 36))
    U, s, Vh = np.linalg.svd(W0, full_matrices=False)
    score = np.abs((U[:, :k] * s[:k]) @ Vh[:k]).ravel()
    expect = np.zeros(score.size, bool)
    expect[np.argsort(-score)[: round(0.1 * score.size)]] = True
    np.testing.assert_array_equal(dg.principal_mask(W0, k, 0.1).numpy().ravel(), expect)


def test_low_magnitude_mask_selects_smallest():
    W0 = _rng(19).standard_normal((30, 30))
    m = dg.low_magnitude_mask(W0, 0.2).numpy()
    assert np.abs(W0[m]).max() <= np.abs(W0[~m]).min()


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_random_update_mask_overlap_is_alpha(alpha):
    W0 = _rng(20).standard_normal((200, 300))
    upd = torch.tensor(_rng(21).random((200, 300)) < 0.3)
    for ref in (dg.principal_mask(W0, 8, alpha), dg.low_magnitude_mask(W0, alpha)):
        out = dg.mask_overlap(upd, ref)
        assert out["baseline"] == pytest.approx(alpha, abs=1e-4)
        assert out["overlap"] == pytest.approx(alpha, abs=0.01)
        assert out["ratio"] == pytest.approx(1.0, abs=0.01 / alpha)


def test_mask_overlap_hand_example():
    upd = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    ref = torch.tensor([1, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    assert dg.mask_overlap(upd, ref) == {"overlap": 0.25, "baseline": 0.25, "ratio": 1.0}
    assert math.isnan(dg.mask_overlap(torch.zeros(8, dtype=torch.bool), ref)["overlap"])


# --------------------------------------------------------------------------- per-cell table
def _lora_pair(seed=22, D=32, N=48, r=4):
    rng = _rng(seed)
    W0 = torch.tensor(rng.standard_normal((D, N)), dtype=torch.float32)
    A = torch.tensor(rng.standard_normal((r, N)), dtype=torch.float32) * 0.1
    B = torch.tensor(rng.standard_normal((D, r)), dtype=torch.float32) * 0.1
    return W0, W0 + B @ A, A


def test_diagnose_matrix_rows_agree_with_functions():
    W0, W1, A = _lora_pair()
    rows = dg.diagnose_matrix("layer0.q", W0, W1, A, k=6, alpha=0.1)
    df = pd.DataFrame(rows)
    assert set(df.columns) == {"matrix", "metric", "index", "value"}
    val = df[df["index"] == 0].set_index("metric")["value"]
    assert val["spectral_drift"] == pytest.approx(dg.spectral_drift(W0, W1))
    pa = dg.principal_angles(W0, W1, 6)
    assert val["max_angle_left_deg"] == pytest.approx(pa["max_angle_left_deg"])
    assert val["subspace_sim_top"] == pytest.approx(dg.subspace_similarity(A, W0)["sim_top"])
    assert val["bf16_sparsity"] == pytest.approx(dg.bf16_update_sparsity(W0, W1))
    ov = dg.mask_overlap(dg.bf16_changed_mask(W0, W1), dg.principal_mask(W0, 6, 0.1))
    assert val["overlap_principal"] == pytest.approx(ov["overlap"])
    assert val["overlap_low_magnitude_baseline"] == pytest.approx(0.1, abs=1e-3)
    assert (df["metric"] == "cos_left").sum() == 6
    assert (df["metric"] == "update_p").sum() == 32
    np.testing.assert_allclose(df[df.metric == "update_cum_energy"]["value"].iloc[-1], 1.0)


def test_diagnose_model_and_parquet_roundtrip(tmp_path):
    W0, W1, A = _lora_pair()
    W0b, W1b, _ = _lora_pair(seed=23, D=16, N=16)
    df = dg.diagnose_model({"a": (W0, W1, A), "b": (W0b, W1b, None)}, k=4, vectors=False)
    assert list(df.columns) == ["matrix", "metric", "index", "value"]
    assert set(df["matrix"]) == {"a", "b"}
    assert "subspace_sim_top" in set(df[df.matrix == "a"]["metric"])
    assert "subspace_sim_top" not in set(df[df.matrix == "b"]["metric"])
    assert not df.duplicated(["matrix", "metric", "index"]).any()
    path = dg.write_parquet(df, tmp_path / "cell" / "diagnostics.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)
    assert sorted(p.name for p in path.parent.iterdir()) == ["diagnostics.parquet"]


# --- the fast path (base factors once, Gram spectrum of W+, LoRA updates through B and A) against the old one


def _spectrum_matrix(D, N, seed):
    """A W0 with distinct singular values spanning a decade (κ = 10): top-k subspaces well defined."""
    M = min(D, N)
    return torch.from_numpy(_with_spectrum(D, N, np.geomspace(10.0, 1.0, M), seed=seed)[0])


def _case(method, D, N, r=3, seed=5):
    """(W0, W1, A, product, update, A_steps) of one method on random factors, all float64."""
    g = torch.Generator().manual_seed(seed)
    W0 = _spectrum_matrix(D, N, seed)
    B, A = 0.3 * torch.randn(D, r, generator=g, dtype=torch.float64), torch.randn(r, N, generator=g, dtype=torch.float64)
    s = 2.0 / r
    steps = {5: torch.randn(r, N, generator=g, dtype=torch.float64), 10: A}
    if method == "lora":
        up = dg.LowRank(B, A, s)
        return W0, W0 + up.dense(), A, None, up, steps
    if method == "pissa":  # the converted adapter: ΔW = s(BA − B0A0) = s·[B, −B0]·[A; A0]; the product s·BA
        B0, A0 = 0.3 * torch.randn(D, r, generator=g, dtype=torch.float64), torch.randn(r, N, generator=g, dtype=torch.float64)
        up = dg.LowRank(torch.cat([B, -B0], 1), torch.cat([A, A0], 0), s)
        return W0, W0 + up.dense(), A, dg.LowRank(B, A, s), up, steps
    if method == "dora":  # column-norm magnitude rescaled: not a low-rank update, the dense path
        V = W0 + s * B @ A
        m = torch.linalg.vector_norm(W0, dim=0) * (1 + 0.05 * torch.randn(N, generator=g, dtype=torch.float64))
        return W0, V * (m / torch.linalg.vector_norm(V, dim=0)), A, None, None, steps
    if method == "sparse":  # a masked update (10% of the entries), the dense path
        mask = torch.rand(D, N, generator=g, dtype=torch.float64) < 0.1
        return W0, W0 + 0.05 * torch.randn(D, N, generator=g, dtype=torch.float64) * mask, None, None, None, None
    raise ValueError(method)




@pytest.mark.parametrize("method", ["lora", "pissa", "dora", "sparse"])
@pytest.mark.parametrize("shape", [(40, 24), (24, 40)])
def test_fast_path_equals_the_two_svd_reference(method, shape):
    """Every row of diagnose_matrix (base factors + Gram spectrum + low-rank alignment) equals the old
    two-SVD computation (tests/support/diagnose_reference.py) within 1e-6 relative (floor: 1e-6 of the metric's
    largest |value| in the matrix, for entries near zero such as c_i of modes the update misses)."""
    W0, W1, A, P, up, steps = _case(method, *shape)
    kw = dict(k=6, alpha=0.1)
    new = pd.DataFrame(dg.diagnose_matrix("m", W0, W1, A, P_DN=P, A_steps=steps, update=up, **kw))
    old = pd.DataFrame(reference_rows("m", W0, W1, A, P_DN=P.dense() if P is not None else None, A_steps=steps, **kw))
    assert list(new[["metric", "index"]].itertuples(index=False)) == list(old[["metric", "index"]].itertuples(index=False))
    scale = old.groupby("metric")["value"].transform(lambda v: v.abs().max())
    err = (new["value"] - old["value"]).abs()
    bad = old[~(err <= 1e-6 * old["value"].abs() + 1e-6 * scale)]
    assert bad.empty, pd.concat([bad, new.loc[bad.index, "value"].rename("new")], axis=1).head(10)
    assert {"update_c", "cos_left", "overlap_principal"} <= set(new["metric"])
    if method == "pissa":
        assert "product_update_c" in set(new["metric"])


def test_fast_path_shares_given_base_factors():
    """A base computed once gives the same rows for two different updates as computing it each time."""
    W0, W1, A, _, up, _ = _case("lora", 40, 24)
    base = dg.base_factors(W0, keep=8)
    W1b = W0 + 0.5 * up.dense()
    for w1, u in ((W1, up), (W1b, dg.LowRank(up.B_DR, up.A_RN, 0.5 * up.s))):
        shared = dg.diagnose_matrix("m", W0, w1, A, k=6, update=u, base=base)
        fresh = dg.diagnose_matrix("m", W0, w1, A, k=6, update=u)
        assert [r["value"] for r in shared] == pytest.approx([r["value"] for r in fresh], rel=1e-12, abs=1e-12)
