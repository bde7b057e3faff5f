"""lorarl.diagnose.gram: W+'s spectrum and top-k vectors from one tridiagonalisation equal eigh / the SVD."""

from __future__ import annotations

import pytest
import torch

from lorarl.diagnose.gram import top_eigh, tuned_spectrum


@pytest.mark.parametrize("M,k", [(2, 1), (7, 3), (60, 16), (150, 5)])
def test_top_eigh_equals_a_full_eigh(M, k):
    X = torch.randn(M, M + 3, generator=torch.Generator().manual_seed(M), dtype=torch.float64)
    G = X @ X.T
    lam, Q = top_eigh(G, k)
    lam_ref, Q_ref = torch.linalg.eigh(G)
    assert torch.allclose(lam, lam_ref.flip(0), rtol=1e-10, atol=1e-10 * float(lam_ref[-1]))
    assert torch.allclose(Q.T @ Q, torch.eye(k, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(G @ Q, Q * lam[:k], atol=1e-9 * float(lam[0]))  # eigenvectors, top k, descending
    assert torch.allclose((Q.T @ Q_ref[:, M - k:]).abs().sum(1), torch.ones(k, dtype=torch.float64), atol=1e-8)


@pytest.mark.parametrize("shape", [(30, 12), (12, 30)])
def test_tuned_spectrum_equals_the_svd(shape):
    W = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    s, U_k, V_k = tuned_spectrum(W, 4)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    assert torch.allclose(s, S, rtol=1e-10)
    for got, ref in ((U_k, U[:, :4]), (V_k, Vh[:4].T)):  # each vector up to its sign
        assert torch.allclose((got * ref).sum(0).abs(), torch.ones(4, dtype=torch.float64), atol=1e-10)
