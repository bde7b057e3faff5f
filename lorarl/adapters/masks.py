"""Sparse fine-tuning masks of one weight W0 (paper 004 §4.2, §5.1). A mask is a bool tensor of W0's
shape, True where the weight is TRAINED; everything else is frozen (receives no update).

    principal      Top_α(|W0^(k)|), W0^(k) = U_k Σ_k V_kᵀ the rank-k SVD reconstruction
    nonprincipal   its complement
    low_magnitude  Bottom_α(|W0|)
    safe           low_magnitude ∪ nonprincipal (the low-magnitude part at β)
    random         uniformly random positions with the same density as `safe` for this matrix

α = `adapter.mask_alpha` (paper 004 uses 50% for the principal mask), k = `adapter.mask_rank`, β =
`adapter.mask_low_alpha` for the low-magnitude part of `safe` / `random` (null: α; paper 004's Table 4: 58.59%).
Top/Bottom select exactly round(α·m·n) entries (ties broken by torch.topk), so the density of `principal`,
`nonprincipal` and `low_magnitude` follows from the shapes alone (:func:`shape_density`); the union's
depends on the weights (how far the two parts overlap).
"""

from __future__ import annotations

import torch

from lorarl.adapters.inits import Spectrum
from lorarl.adapters.names import MASKS

NEEDS_SVD = ("principal", "nonprincipal", "safe", "random")


def top_fraction(score: torch.Tensor, alpha: float) -> torch.Tensor:
    n_sel = int(round(alpha * score.numel()))
    mask = torch.zeros(score.numel(), dtype=torch.bool, device=score.device)
    if n_sel > 0:
        mask[torch.topk(score.flatten(), n_sel).indices] = True
    return mask.view(score.shape)


def principal(W0: torch.Tensor, spectrum: Spectrum, k: int, alpha: float) -> torch.Tensor:
    U, S, Vh = spectrum.top(min(k, spectrum.M))
    recon = (U.float() * S.float()[None, :]) @ Vh.float()
    return top_fraction(recon.abs(), alpha)


def low_magnitude(W0: torch.Tensor, alpha: float) -> torch.Tensor:
    return top_fraction(-W0.detach().float().abs(), alpha)


def shape_density(kind: str, shapes: list[tuple[int, int]], alpha: float) -> float:
    """Trained fraction of the entries of matrices of these shapes under a mask whose density follows from
    the shapes (principal, nonprincipal, low_magnitude: round(α·m·n) entries each); paper 004's "#params"."""
    if kind not in ("principal", "nonprincipal", "low_magnitude"):
        raise ValueError(f"mask {kind!r}: its density depends on the weights; allowed: principal, nonprincipal, "
                         "low_magnitude")
    total = sum(m * n for m, n in shapes)
    top = sum(int(round(alpha * m * n)) for m, n in shapes)
    return (total - top if kind == "nonprincipal" else top) / total


def make_mask(kind: str, W0: torch.Tensor, *, alpha: float, k: int, spectrum: Spectrum | None,
              gen: torch.Generator, low_alpha: float | None = None) -> torch.Tensor:
    if kind not in MASKS:
        raise ValueError(f"unknown mask {kind!r}; allowed: {', '.join(MASKS)}")
    if kind in NEEDS_SVD and spectrum is None:
        raise ValueError(f"mask {kind!r} needs the SVD of W0")
    if kind == "low_magnitude":
        return low_magnitude(W0, alpha)
    princ = principal(W0, spectrum, k, alpha)
    if kind == "principal":
        return princ
    if kind == "nonprincipal":
        return ~princ
    safe = low_magnitude(W0, alpha if low_alpha is None else low_alpha) | ~princ
    if kind == "safe":
        return safe
    density = float(safe.double().mean())  # random: same density as `safe` for this matrix
    scores = torch.rand(W0.shape, generator=gen, dtype=torch.float32).to(W0.device)
    return top_fraction(scores, density)
