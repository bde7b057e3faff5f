"""lorarl.adapters.inits: each LoRA initialisation follows its definition (issue 5, invariant 3: init
geometry, pure math on random matrices; the PEFT round trips are in tests/adapters/test_adapters.py)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from lorarl.adapters import INITS
from lorarl.adapters import inits as I
from lorarl.adapters.names import ORTHONORMAL_INITS, RESIDUAL_INITS


@pytest.mark.parametrize("m,n", [(48, 40), (24, 40)])
@pytest.mark.parametrize("init", INITS)
def test_init_definitions(init, m, n):
    torch.manual_seed(3)
    W0 = torch.randn(m, n)
    r, s = 6, 2.0
    U, S, Vh = torch.linalg.svd(W0.double(), full_matrices=False)
    spec = I.spectrum_of(W0, keep=64)
    B0, A0 = I.lora_init(init, m, n, r, spectrum=spec, gen=I.seeded_generator(0, "w"), scale=s)
    assert B0.shape == (m, r) and A0.shape == (r, n)
    eye = torch.eye(r)
    top = slice(0, r)
    bot = slice(S.numel() - r, S.numel())
    if init in ORTHONORMAL_INITS:
        assert (B0 == 0).all()
        assert torch.allclose(A0 @ A0.T, eye, atol=1e-5)
    if init in RESIDUAL_INITS:
        Wres = I.residual(W0, B0, A0, s)
        assert torch.allclose(Wres + s * B0 @ A0, W0, atol=1e-5)  # residual + s B0 A0 = W0
        sl = top if init in ("pissa", "olora") else bot
        if init in ("pissa", "milora"):  # B0 = U (Σ/s)^½, A0 = (Σ/s)^½ Vᵀ: s·B0A0 = U Σ Vᵀ (papers 002, 003)
            recon = (U[:, sl] * S[sl]) @ Vh[sl]
            assert torch.allclose(s * (B0 @ A0).double(), recon, atol=1e-4)
            assert torch.allclose(I.residual(W0, B0, A0, s).double(), W0.double() - recon, atol=1e-4)
            assert torch.allclose((B0.T @ B0).double(), torch.diag(S[sl] / s), atol=1e-4)
            assert torch.allclose((A0 @ A0.T).double(), torch.diag(S[sl] / s), atol=1e-4)
        else:  # B0 = U_r, A0 = V_rᵀ (products are sign-invariant)
            assert torch.allclose((B0 @ A0).double(), U[:, sl] @ Vh[sl], atol=1e-5)
            assert torch.allclose(B0.T @ B0, eye, atol=1e-5) and torch.allclose(A0 @ A0.T, eye, atol=1e-5)
    if init in ("rlpo", "rlmo"):  # A0ᵀA0 = projector on the top / bottom right singular subspace
        sl = top if init == "rlpo" else bot
        assert torch.allclose((A0.T @ A0).double(), Vh[sl].T @ Vh[sl], atol=1e-5)
    if init == "dct":
        from scipy.fft import dct

        D = dct(np.eye(n), type=2, norm="ortho", axis=0)[:r]
        assert np.allclose(A0.numpy(), D, atol=1e-6)
    if init in ("kaiming", "gaussian"):
        assert (B0 == 0).all()


def test_haar_is_orthogonal_for_any_length_and_wavelet_follows_the_definition():
    for n in (1, 2, 5, 8, 13):
        H = I.haar_rows(torch.eye(n, dtype=torch.float64))
        assert torch.allclose(H @ H.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    g1, g2 = I.seeded_generator(0, "a"), I.seeded_generator(0, "a")
    A = I.wavelet_rows(5, 13, g1)
    G = torch.randn(5, 13, generator=g2, dtype=torch.float64)
    Q, _ = torch.linalg.qr(I.haar_rows(G).T)
    assert torch.allclose(A, Q.T.float()) and torch.allclose(A @ A.T, torch.eye(5), atol=1e-6)
    assert not torch.allclose(A, I.wavelet_rows(5, 13, I.seeded_generator(1, "a")))


