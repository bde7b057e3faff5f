"""Initialisations of a LoRA pair (B0, A0) for one weight W0 ∈ R^{m×n} (out × in), as the init-geometry
study defines them (paper 003 §3.1, §4.1, §5.2, §6) with LoRA's scale s (α/r, or α/√r for rsLoRA):

    W0 = U Σ Vᵀ (thin SVD, M = min(m, n) modes, σ descending); U_r/V_r: first r columns, U_-r/V_-r: last r.
    kaiming     B0 = 0, A0 ~ kaiming-uniform(a=√5) = U(−1/√n, 1/√n)           (peft's default LoRA init)
    gaussian    B0 = 0, A0 ~ N(0, 1/n)                                          (standard LoRA, paper 003 eq. 2)
    pissa       B0 = U_r (Σ_r/s)^½,  A0 = (Σ_r/s)^½ V_rᵀ,  residual W0 − s·B0A0 = W0 − U_rΣ_rV_rᵀ frozen
    milora      B0 = U_-r (Σ_-r/s)^½, A0 = (Σ_-r/s)^½ V_-rᵀ, residual W0 − U_-rΣ_-rV_-rᵀ
    olora       B0 = U_r,  A0 = V_rᵀ,  residual W0 − s·B0A0
    olora_tail  B0 = U_-r, A0 = V_-rᵀ, residual W0 − s·B0A0
    rlpo        B0 = 0, A0 = V_rᵀ
    rlmo        B0 = 0, A0 = V_-rᵀ
    dct         B0 = 0, A0 = first r rows of the orthonormal DCT-II matrix D ∈ R^{n×n}
    wavelet     B0 = 0, A0 = Qᵀ with QR = H(G)ᵀ, G ∈ R^{r×n} Gaussian, H the row-wise Haar transform

The adapted layer computes (W_res + s·BA)x, so the residual subtracts s·B0A0 and the step-0 weight
is W0 exactly for every init.

PiSSA / MiLoRA scaling (papers 002 Table 1, 003 eqs. 3–4): W = (W0 − B0A0) + BA with B0A0 the
top-r (bottom-r) part U_rΣ_rV_rᵀ of W0 itself. With LoRA's scale that is s·B0A0 = U_rΣ_rV_rᵀ:
the adapter starts as exactly that part of W0, whatever α is — peft's convention
(`init_lora_weights="pissa"` divides Σ_r by s; tests/adapters/test_adapters.py checks the two agree up to
sign). At s = 1 the factors are eq. 3's U_rΣ_r^½, Σ_r^½V_rᵀ. (Before this, B0 = U_rΣ_r^½ for any
s: the adapter started at s·U_rΣ_rV_rᵀ and its updates were √s larger; not kept.)
OLoRA / OLoRA-tail / RLPO / RLMO keep orthonormal factors (eq. 7 and §6 define the factors, and
their orthonormality is the point); the residual makes step 0 exact.

Differences from peft 0.21.2:
- peft `init_lora_weights="olora"` uses a QR of W0 (B0 = Q_r, A0 = R_r), not the SVD factors above.
- peft has no milora / olora_tail / rlpo / rlmo / dct / wavelet.

All functions are pure: tensors in, tensors out (float32 unless stated), no model access.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from lorarl.adapters.names import INITS, RESIDUAL_INITS, SVD_INITS


@dataclass
class Spectrum:
    """The part of a thin SVD W0 = U diag(S) Vh that inits and masks need: all singular values and the
    top-K / bottom-K singular vectors (K = M when the whole SVD is kept)."""

    S: torch.Tensor  # (M,) descending
    U_top: torch.Tensor  # (m, K)
    Vh_top: torch.Tensor  # (K, n)
    U_bot: torch.Tensor  # (m, K): the last K columns of U
    Vh_bot: torch.Tensor  # (K, n): the last K rows of Vh

    @property
    def M(self) -> int:
        return self.S.numel()

    @property
    def K(self) -> int:
        return self.U_top.shape[1]

    def top(self, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self._need(r)
        return self.U_top[:, :r], self.S[:r], self.Vh_top[:r]

    def bottom(self, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self._need(r)
        return self.U_bot[:, self.K - r:], self.S[self.M - r:], self.Vh_bot[self.K - r:]

    def _need(self, r: int) -> None:
        if r > self.M:
            raise ValueError(f"rank {r} exceeds min(out, in) = {self.M} of this weight")
        if r > self.K:
            raise ValueError(f"spectrum keeps {self.K} singular vectors per side, {r} requested")

    def to(self, device) -> "Spectrum":
        return Spectrum(*(t.to(device) for t in (self.S, self.U_top, self.Vh_top, self.U_bot, self.Vh_bot)))


def spectrum_of(W: torch.Tensor, keep: int) -> Spectrum:
    """Thin SVD of W in float32 on W's device, truncated to the top/bottom `keep` vectors."""
    U, S, Vh = torch.linalg.svd(W.detach().float(), full_matrices=False)
    M = S.numel()
    k = min(keep, M)
    return Spectrum(S.contiguous(), U[:, :k].contiguous(), Vh[:k].contiguous(),
                    U[:, M - k:].contiguous(), Vh[M - k:].contiguous())


def dct_rows(r: int, n: int) -> torch.Tensor:
    """First r rows of the orthonormal DCT-II matrix D_ij = a_i cos(π(2j+1)i / 2n), a_0 = √(1/n),
    a_i = √(2/n) (paper 003 §6). Computed in float64, returned float32."""
    if r > n:
        raise ValueError(f"dct init needs r <= n, got r={r}, n={n}")
    i = torch.arange(r, dtype=torch.float64)[:, None]
    j = torch.arange(n, dtype=torch.float64)[None, :]
    D = torch.cos(math.pi * (2 * j + 1) * i / (2 * n)) * math.sqrt(2.0 / n)
    D[0] = D[0] / math.sqrt(2.0)
    return D.float()


def haar_rows(X: torch.Tensor) -> torch.Tensor:
    """Full multi-level orthonormal Haar transform of each row of X (any length n: at each level the
    pairs (a, b) map to ((a+b)/√2, (a−b)/√2) and an odd last entry is carried to the next level, so
    the transform is an orthogonal matrix for every n). Output layout: [approx | details coarse→fine]."""
    out = X.clone()
    length = X.shape[-1]
    s2 = math.sqrt(2.0)
    while length > 1:
        seg = out[..., :length]
        p = length // 2
        even, odd = seg[..., 0:2 * p:2], seg[..., 1:2 * p:2]
        approx, detail = (even + odd) / s2, (even - odd) / s2
        carry = seg[..., 2 * p:length]  # empty or the odd last entry
        out[..., :length] = torch.cat([approx, carry, detail], dim=-1)
        length = p + carry.shape[-1]
    return out


def seeded_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator that depends on (seed, module name) only: inits do not depend on module order."""
    h = int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "little")
    g = torch.Generator()
    g.manual_seed(h & ((1 << 63) - 1))
    return g


def wavelet_rows(r: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """A0 = Qᵀ, Q R = H(G)ᵀ with G ∈ R^{r×n} standard Gaussian (paper 003 §6): A0 A0ᵀ = I_r."""
    if r > n:
        raise ValueError(f"wavelet init needs r <= n, got r={r}, n={n}")
    G = torch.randn(r, n, generator=gen, dtype=torch.float64)
    Q, _ = torch.linalg.qr(haar_rows(G).T)  # (n, r), orthonormal columns
    return Q.T.contiguous().float()


def gaussian_rows(r: int, n: int, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(r, n, generator=gen, dtype=torch.float64) / math.sqrt(n)).float()


def kaiming_rows(r: int, n: int, gen: torch.Generator) -> torch.Tensor:
    bound = 1.0 / math.sqrt(n)  # kaiming_uniform_(a=√5) on an (r, n) weight: gain √(1/3) · √(3/n)
    return ((torch.rand(r, n, generator=gen, dtype=torch.float64) * 2 - 1) * bound).float()


def lora_init(init: str, m: int, n: int, r: int, *, spectrum: Spectrum | None = None,
              gen: torch.Generator | None = None, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B0 ∈ R^{m×r}, A0 ∈ R^{r×n}) in float32 for init `init` (module docstring); `scale` is the
    adapter's s (pissa / milora: s·B0A0 = U Σ Vᵀ of the chosen singular triplets)."""
    if scale <= 0:
        raise ValueError(f"adapter scale must be > 0, got {scale}")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; allowed: {', '.join(INITS)}")
    if init in SVD_INITS and spectrum is None:
        raise ValueError(f"init {init!r} needs the SVD of W0")
    if r > min(m, n) and init in SVD_INITS:
        raise ValueError(f"init {init!r}: rank {r} exceeds min(out, in) = {min(m, n)}")
    gen = gen if gen is not None else torch.Generator().manual_seed(0)
    zeros_B = torch.zeros(m, r)
    if init == "kaiming":
        return zeros_B, kaiming_rows(r, n, gen)
    if init == "gaussian":
        return zeros_B, gaussian_rows(r, n, gen)
    if init == "dct":
        return zeros_B, dct_rows(r, n)
    if init == "wavelet":
        return zeros_B, wavelet_rows(r, n, gen)
    assert spectrum is not None
    U, S, Vh = spectrum.top(r) if init in ("pissa", "olora", "rlpo") else spectrum.bottom(r)
    U, S, Vh = U.float().cpu(), S.float().cpu(), Vh.float().cpu()
    if init in ("rlpo", "rlmo"):
        return zeros_B, Vh.clone()
    if init in ("olora", "olora_tail"):
        return U.clone(), Vh.clone()
    root = (S.clamp_min(0) / scale).sqrt()  # pissa / milora: s·B0A0 = U_r Σ_r V_rᵀ (peft's convention)
    return U * root[None, :], root[:, None] * Vh


def residual(W0: torch.Tensor, B0: torch.Tensor, A0: torch.Tensor, scale: float) -> torch.Tensor:
    """W0 − s·B0A0 computed in float32 on W0's device, returned in W0's dtype."""
    W = W0.detach().float()
    return (W - scale * (B0.to(W.device, torch.float32) @ A0.to(W.device, torch.float32))).to(W0.dtype)


def is_residual(init: str) -> bool:
    return init in RESIDUAL_INITS
