"""W+'s singular values and top-k singular vectors from its M×M Gram matrix, without an SVD (float64).

The diagnose stage needs every singular value of W+ (spectral drift, `sigma_tuned`) but only its top-k
vectors (principal angles); one tridiagonalisation gives both (docs/report.md#diagnostics-cost-and-tolerance).
"""

from __future__ import annotations

import torch


def tuned_spectrum(W1_DN, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W+'s singular values (all M) and top-k singular vectors (U_Dk, V_Nk) from the eigendecomposition of its
    M×M Gram matrix in float64 (σ_i = √λ_i; the other side's top vectors u_i = W+ v_i / σ_i). No vectors
    beyond the top k are computed. σ_i's relative error grows to ~ε·(σ_1/σ_i)² (the Gram matrix squares the
    condition number): below 1e-8 for any weight with σ_1/σ_M < 1e4."""
    W = W1_DN.detach().to(torch.float64)
    D, N = W.shape
    G_MM = W.T @ W if D >= N else W @ W.T
    k = min(k, G_MM.shape[0])
    lam_M, top = top_eigh(G_MM, k)
    s_M = lam_M.clamp_min(0).sqrt()
    other = (W @ top if D >= N else W.T @ top) / s_M[:k]
    return (s_M, other, top) if D >= N else (s_M, top, other)


def top_eigh(G_MM: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All eigenvalues (descending) of a symmetric float64 G and the eigenvectors of the k largest (M×k).

    On the CPU one Householder tridiagonalisation (LAPACK dsytrd) serves both: dsterf gives every eigenvalue,
    dstebz + dstein the top k eigenvectors of the tridiagonal, mapped back through the k-column product of the
    reflectors, about the cost of the eigenvalues alone (a full eigh would back-transform all M vectors). On
    a GPU: torch.linalg.eigh (cheap there; not exercised by the tests, which run on the CPU)."""
    M = G_MM.shape[0]
    if G_MM.is_cuda or M < 3:
        lam, Q = torch.linalg.eigh(G_MM)
        return lam.flip(0), Q[:, M - k:].flip(1)
    import numpy as np
    from scipy.linalg import lapack

    lwork = int(lapack.dsytrd_lwork(M, lower=1)[0])
    c, d, e, tau, info = lapack.dsytrd(G_MM.cpu().numpy(), lower=1, lwork=max(lwork, M))
    if info != 0:
        raise RuntimeError(f"dsytrd failed (info={info})")
    lam, info = lapack.dsterf(d, e)
    if info != 0:
        raise RuntimeError(f"dsterf failed (info={info})")
    m, w, iblock, isplit, info = lapack.dstebz(d, e, 3, 0.0, 0.0, M - k + 1, M, 0.0, "B")
    if info != 0 or m != k:
        raise RuntimeError(f"dstebz found {m} of the top {k} eigenvalues (info={info})")
    Z, info = lapack.dstein(d, e, w[:m], iblock, isplit)
    if info != 0:
        raise RuntimeError(f"dstein: {info} eigenvectors did not converge")
    Z = np.ascontiguousarray(Z[:, :m])
    for i in range(M - 2, -1, -1):  # Q = H(1)…H(M−1), H(i) = I − τ_i v vᵀ, v = e_{i+1} + c[i+2:, i] (0-based)
        if tau[i] == 0.0:
            continue
        v = np.concatenate(([1.0], c[i + 2:, i]))
        Z[i + 1:] -= tau[i] * np.outer(v, v @ Z[i + 1:])
    order = np.argsort(w[:m])[::-1].copy()
    return (torch.from_numpy(np.sort(lam)[::-1].copy()).to(G_MM.device),
            torch.from_numpy(Z[:, order]).to(G_MM.device))
