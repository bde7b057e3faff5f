"""Weight-space diagnostics of one adapted matrix: what training did to W, not to accuracy.

Notation (paper 004 §2.1/§4, paper 003 §4/Fig. 3/Fig. 7): W0 ∈ R^{D×N} is the frozen base weight
(D = out_features, N = in_features), W+ (here `W1`) the effective weight after training (merged
adapter or fully fine-tuned), ΔW = W+ − W0, and W0 = U Σ Vᵀ its thin SVD with M = min(D, N)
modes ordered by decreasing σ. Shape suffixes name dimensions: `W0_DN`, `A_RN` (LoRA A, R×N),
`sigma_M`, `cos_K`.

All linear algebra runs in float64 on the tensors' own device (a CUDA tensor stays on the GPU);
inputs may be any float dtype. Top-k subspaces are only defined up to ties σ_k = σ_{k+1}.
The only I/O is `write_parquet`.

Cost (docs/report.md#diagnostics-cost-and-tolerance): `diagnose_matrix` never runs an SVD of W+ or of ΔW.
W0's SVD is `base_factors` (once per base matrix; lorarl.diagnose.cache shares it between cells); W+'s
singular values and top-k vectors come from the eigendecomposition of its M×M Gram matrix; a LoRA update
(`LowRank`, ΔW = s·B·A) is aligned with W0's modes through B and A (O(D·N·R)), never densely.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

import pandas as pd
import torch

from lorarl.diagnose.gram import tuned_spectrum

DEFAULT_K = 16  # top-k singular subspace for principal angles and the principal mask
DEFAULT_ALPHA = 0.05  # density of the principal / low-magnitude reference masks
BF16_ETA = 1e-3  # relative tolerance of the bf16 probe (paper 004, Def. 2.1)

SVD = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (U_DM, sigma_M, Vh_MN)


def _f64(W) -> torch.Tensor:
    t = W if isinstance(W, torch.Tensor) else torch.as_tensor(W)
    return t.detach().to(torch.float64)


@dataclass(frozen=True)
class LowRank:
    """A rank-≤R update ΔW = s·B·A (a LoRA's B_DR, A_RN and scale s = α/r; a residual init's converted
    [B, −B0], [A; A0]): its alignment with W0's modes needs only W0's factors times B and A."""

    B_DR: torch.Tensor
    A_RN: torch.Tensor
    s: float  # peft's scaling (α/r, or α/√r for rsLoRA)

    def dense(self) -> torch.Tensor:
        """ΔW as a float64 D×N matrix."""
        return self.s * (_f64(self.B_DR) @ _f64(self.A_RN).to(self.B_DR.device))


@dataclass(frozen=True)
class BaseFactors:
    """What the diagnostics need of a base matrix W0 = U diag(S) Vh (its float64 thin SVD), kept once per base:
    all M singular values, the top / bottom K singular vectors of each side, and the one full factor that is
    M×M (F = V_NM when D ≥ N, else U_DM): the SVD-aligned update c_i = |u_iᵀ ΔW v_i| reads every mode, and
    the other side's vectors follow from W0 (u_i = W0 v_i / σ_i), so the D×M + N×M full SVD is never stored."""

    S_M: torch.Tensor  # all singular values, descending
    U_top_DK: torch.Tensor  # first K columns of U
    Vh_top_KN: torch.Tensor  # first K rows of Vh
    U_bot_DK: torch.Tensor  # last K columns of U
    Vh_bot_KN: torch.Tensor  # last K rows of Vh
    F_XM: torch.Tensor  # the full M×M-side factor: V (N×M) if right else U (D×M)
    right: bool  # F is V (D ≥ N)

    @property
    def K(self) -> int:
        return self.U_top_DK.shape[1]

    def to(self, device) -> "BaseFactors":
        return BaseFactors(*(getattr(self, f.name).to(device) if f.name != "right" else self.right
                             for f in fields(self)))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def base_factors(W0_DN, keep: int) -> BaseFactors:
    """W0's thin SVD in float64 reduced to `BaseFactors` with K = min(keep, M) vectors per side and end."""
    U, S, Vh = svd(W0_DN)
    D, N = U.shape[0], Vh.shape[1]
    M = S.numel()
    k = min(keep, M)
    right = D >= N
    F = Vh.T.contiguous() if right else U.contiguous()
    return BaseFactors(S, U[:, :k].contiguous(), Vh[:k].contiguous(), U[:, M - k:].contiguous(),
                       Vh[M - k:].contiguous(), F, right)


def aligned_update(base: BaseFactors, W0_DN, dW) -> torch.Tensor:
    """c_i = |u_iᵀ ΔW v_i| for every mode i of W0 (paper 003 Fig. 3) from `BaseFactors` (float64).

    ΔW a `LowRank`: c_i = s·|(UᵀB)_i · (AV)_i| with UᵀB = Σ⁻¹VᵀW0ᵀB (or AV = A W0ᵀ U Σ⁻¹), O(D·N·R); a dense ΔW
    (DoRA, full fine-tuning, masks): the missing factor from W0, O(D·N·M). Modes with σ_i = 0 (an exactly
    rank-deficient W0) have no defined u_i (or v_i) and give NaN here."""
    W0 = _f64(W0_DN)
    S, F = base.S_M, base.F_XM
    if isinstance(dW, LowRank):
        B, A = _f64(dW.B_DR).to(W0.device), _f64(dW.A_RN).to(W0.device)
        if base.right:
            UtB_MR, AV_RM = (F.T @ (W0.T @ B)) / S[:, None], A @ F
        else:
            UtB_MR, AV_RM = F.T @ B, ((A @ W0.T) @ F) / S
        return (dW.s * (UtB_MR * AV_RM.T).sum(dim=1)).abs()
    dW_DN = _f64(dW).to(W0.device)
    U_DM, V_NM = ((W0 @ F) / S, F) if base.right else (F, (W0.T @ F) / S)
    return (U_DM * (dW_DN @ V_NM)).sum(dim=0).abs()


def _energy(c_M: torch.Tensor) -> dict:
    e_M = c_M.square()
    return {"c_M": c_M, "p_M": c_M / c_M.sum(), "cum_energy_M": e_M.cumsum(0) / e_M.sum()}


def svd(W_DN) -> SVD:
    """Thin SVD in float64: W = U diag(σ) Vh, σ descending. Returns (U_DM, sigma_M, Vh_MN)."""
    return torch.linalg.svd(_f64(W_DN), full_matrices=False)


def spectral_drift(W0_DN, W1_DN) -> float:
    """Normalised spectral shift NSS = ‖σ(W+) − σ(W0)‖₂ / ‖σ(W0)‖₂ (paper 004 §4.1).

    Invariant to W+ = Q W0 Rᵀ with Q, R orthogonal (a pure rotation has NSS = 0).
    """
    s0_M = torch.linalg.svdvals(_f64(W0_DN))
    s1_M = torch.linalg.svdvals(_f64(W1_DN))
    return float(torch.linalg.vector_norm(s1_M - s0_M) / torch.linalg.vector_norm(s0_M))


def _subspace_cosines(Q0_DK: torch.Tensor, Q1_DK: torch.Tensor) -> tuple[torch.Tensor, float]:
    """cos θ_i = σ_i(Q0ᵀ Q1) (descending, so θ ascending); largest angle via
    atan2(‖(I − Q0Q0ᵀ)Q1‖₂, σ_min(Q0ᵀQ1)), accurate for tiny and for near-right angles."""
    M_KK = Q0_DK.T @ Q1_DK
    cos_K = torch.linalg.svdvals(M_KK).clamp(0.0, 1.0)
    sin_max = torch.linalg.matrix_norm(Q1_DK - Q0_DK @ M_KK, ord=2)
    return cos_K, float(torch.atan2(sin_max, cos_K[-1]))


def principal_angles(W0_DN, W1_DN, k: int = DEFAULT_K, *, svd0: SVD | None = None,
                     svd1: SVD | None = None) -> dict:
    """Principal angles between the top-k singular subspaces of W0 and W+ (paper 004 §4.1).

    Left: cos θ_i(U) = σ_i(U0,kᵀ U+,k); right: cos θ_i(V) = σ_i(V0,kᵀ V+,k), i = 1..k, descending.
    Returns {"cos_left_K", "cos_right_K"} (float64 tensors) and the largest angles in degrees
    {"max_angle_left_deg", "max_angle_right_deg"}. k is clipped to min(D, N).
    """
    U0, _, Vh0 = svd0 if svd0 is not None else svd(W0_DN)
    U1, _, Vh1 = svd1 if svd1 is not None else svd(W1_DN)
    k = min(k, U0.shape[1])
    cos_l, ang_l = _subspace_cosines(U0[:, :k], U1[:, :k])
    cos_r, ang_r = _subspace_cosines(Vh0[:k].T, Vh1[:k].T)
    return {"cos_left_K": cos_l, "cos_right_K": cos_r,
            "max_angle_left_deg": math.degrees(ang_l), "max_angle_right_deg": math.degrees(ang_r)}


def svd_aligned_update(W0_DN, dW_DN, *, svd0: SVD | None = None) -> dict:
    """Update energy along the base singular directions (paper 003, Fig. 3).

    c_i = |u_iᵀ ΔW v_i|, p_i = c_i / Σ_j c_j, cum_energy_i = Σ_{j≤i} c_j² / Σ_j c_j², with i ordered
    by decreasing σ_i(W0). Returns {"c_M", "p_M", "cum_energy_M"}; p and cum_energy are NaN if ΔW = 0.
    """
    U, _, Vh = svd0 if svd0 is not None else svd(W0_DN)
    return _energy(((U.T @ _f64(dW_DN).to(U.device)) * Vh).sum(dim=1).abs())


def subspace_similarity(A_RN, W0_DN, r: int | None = None, *, svd0: SVD | None = None) -> dict:
    """Similarity of a LoRA A (R×N) with W0's right singular subspaces (paper 003, Fig. 7).

    sim_top = ‖A V_{:, :r}‖_F / ‖A‖_F and sim_bottom = ‖A V_{:, M−r:}‖_F / ‖A‖_F, V from the thin SVD
    (so "bottom" means the r smallest of the M = min(D, N) singular values). r defaults to R.
    Both lie in [0, 1]; a random A has E[sim²] = r / N.
    """
    _, _, Vh = svd0 if svd0 is not None else svd(W0_DN)
    A = _f64(A_RN).to(Vh.device)
    r = min(A.shape[0] if r is None else r, Vh.shape[0])
    nA = torch.linalg.matrix_norm(A)
    top = torch.linalg.matrix_norm(A @ Vh[:r].T) / nA
    bottom = torch.linalg.matrix_norm(A @ Vh[Vh.shape[0] - r:].T) / nA
    return {"sim_top": float(top), "sim_bottom": float(bottom), "r": r}


def bf16_changed_mask(W0_DN, W1_DN, eta: float = BF16_ETA) -> torch.Tensor:
    """Changed-weight mask under bf16 storage (paper 004, Def. 2.1): with both weights cast to
    bf16, w is unchanged iff |w+ − w0| ≤ η·max(|w0|, |w+|). Returns True where *changed*.

    For any 0 ≤ η < 2⁻⁸ (so for η = 1e-3, Lemma E.1/Prop. E.3) this is exactly "the bf16 values
    differ", i.e. bitwise inequality of the bf16 codes up to the sign of zero: distinct bf16 values,
    subnormals included, are more than 2⁻⁸ apart relative to the larger magnitude.
    """
    w0 = _f64(torch.as_tensor(W0_DN).to(torch.bfloat16))
    w1 = _f64(torch.as_tensor(W1_DN).to(torch.bfloat16))
    return (w1 - w0).abs() > eta * torch.maximum(w0.abs(), w1.abs())


def bf16_update_sparsity(W0_DN, W1_DN, eta: float = BF16_ETA) -> float:
    """sparsity_bf16 = 1 − |{i : w+_i ≠_η w0_i}| / n, the fraction of weights unchanged under the
    bf16 probe of `bf16_changed_mask` (paper 004, Def. 2.2)."""
    return 1.0 - float(bf16_changed_mask(W0_DN, W1_DN, eta).double().mean())


def _top_fraction(score: torch.Tensor, alpha: float) -> torch.Tensor:
    n = score.numel()
    n_sel = int(round(alpha * n))
    mask = torch.zeros(n, dtype=torch.bool, device=score.device)
    if n_sel > 0:
        mask[torch.topk(score.flatten(), n_sel).indices] = True
    return mask.view(score.shape)


def principal_mask(W0_DN, k: int = DEFAULT_K, alpha: float = DEFAULT_ALPHA, *,
                   svd0: SVD | None = None) -> torch.Tensor:
    """Principal-weight mask M_princ = Top_α(|W0^(k)|), W0^(k) = U_k Σ_k V_kᵀ the rank-k SVD
    reconstruction (paper 004 §4.2). Density = round(α·D·N) / (D·N); ties broken arbitrarily."""
    U, s, Vh = svd0 if svd0 is not None else svd(W0_DN)
    k = min(k, s.numel())
    return _top_fraction(((U[:, :k] * s[:k]) @ Vh[:k]).abs(), alpha)


def low_magnitude_mask(W0_DN, alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """Low-magnitude mask M_low = Bottom_α(|W0|) (paper 004 §4.2); density round(α·D·N)/(D·N)."""
    return _top_fraction(-_f64(W0_DN).abs(), alpha)


def mask_overlap(update_mask, reference_mask) -> dict:
    """Overlap(M•, M) = |M• ∩ M| / |M| of the update mask M with a reference mask M• (paper 004
    §4.2), against its random-guess baseline density(M•) (= α for the masks above).
    Returns {"overlap", "baseline", "ratio" = overlap / baseline}; overlap is NaN if M is empty."""
    upd = torch.as_tensor(update_mask, dtype=torch.bool)
    ref = torch.as_tensor(reference_mask, dtype=torch.bool).to(upd.device)
    n_upd = int(upd.sum())
    overlap = float((upd & ref).sum()) / n_upd if n_upd else float("nan")
    baseline = float(ref.double().mean())
    return {"overlap": overlap, "baseline": baseline,
            "ratio": overlap / baseline if baseline > 0 else float("nan")}


def _similarity(A_RN, base: BaseFactors, r: int | None) -> dict:
    """`subspace_similarity` from the base's kept top / bottom rows of Vh (K ≥ r)."""
    A = _f64(A_RN).to(base.S_M.device)
    r = min(A.shape[0] if r is None else r, base.S_M.numel())
    if r > base.K:
        raise ValueError(f"subspace similarity at r={r} needs {r} base singular vectors, {base.K} kept")
    nA = torch.linalg.matrix_norm(A)
    top = torch.linalg.matrix_norm(A @ base.Vh_top_KN[:r].T) / nA
    bottom = torch.linalg.matrix_norm(A @ base.Vh_bot_KN[base.K - r:].T) / nA
    return {"sim_top": float(top), "sim_bottom": float(bottom), "r": r}


def diagnose_matrix(name: str, W0_DN, W1_DN, A_RN=None, rank: int | None = None,
                    k: int = DEFAULT_K, alpha: float = DEFAULT_ALPHA, eta: float = BF16_ETA,
                    vectors: bool = True, P_DN=None, A_steps: Mapping[int, object] | None = None,
                    update: LowRank | None = None, base: BaseFactors | None = None,
                    device=None) -> list[dict]:
    """All diagnostics of one matrix as long-format rows {matrix, metric, index, value}.

    Scalar metrics have index 0; vector metrics (singular values, cosines, c/p/cum_energy) one row
    per entry, index = 0-based mode (skip them with vectors=False). Subspace similarity needs the
    LoRA A; `rank` (default A's row count) sets its r. W0's factors and W+'s Gram spectrum are shared
    by all metrics.
    `P_DN`: the adapter product (α/r)BA (residual inits, where it differs from W+ − W0): its
    SVD-aligned distribution along W0's directions is added as ``product_update_c/p/cum_energy``.
    `A_steps`: training step -> the LoRA A at that step (snapshots and the final adapter): paper 003 Fig. 7's
    similarity through training, as ``subspace_sim_top_step`` / ``subspace_sim_bottom_step`` rows whose
    index is the training step (W0's SVD shared).
    `update`: ΔW = W+ − W0 as a `LowRank` where the method has one (its alignment then skips the dense ΔW);
    P_DN may be one too. `base`: W0's `BaseFactors` (a cache's, shared between cells; computed here when
    None). `device`: where the algebra runs (default W0's).
    """
    W0 = _f64(W0_DN).to(device) if device is not None else _f64(W0_DN)
    W1 = _f64(W1_DN).to(W0.device)
    base = base.to(W0.device) if base is not None else base_factors(W0, keep=max(k, *_ranks(A_RN, A_steps, rank)))
    s0 = base.S_M
    k = min(k, s0.numel())
    s1, U1_Dk, V1_Nk = tuned_spectrum(W1, k)
    scalars: dict[str, float] = {
        "spectral_drift": float(torch.linalg.vector_norm(s1 - s0) / torch.linalg.vector_norm(s0)),
        "rel_update_fro": float(torch.linalg.matrix_norm(W1 - W0) / torch.linalg.matrix_norm(W0)),
    }
    vecs: dict[str, torch.Tensor] = {"sigma_base": s0, "sigma_tuned": s1}
    cos_l, ang_l = _subspace_cosines(base.U_top_DK[:, :k], U1_Dk)
    cos_r, ang_r = _subspace_cosines(base.Vh_top_KN[:k].T, V1_Nk)
    scalars["max_angle_left_deg"], scalars["max_angle_right_deg"] = math.degrees(ang_l), math.degrees(ang_r)
    vecs["cos_left"], vecs["cos_right"] = cos_l, cos_r
    upd = _energy(aligned_update(base, W0, update if update is not None else W1 - W0))
    vecs["update_c"], vecs["update_p"] = upd["c_M"], upd["p_M"]
    vecs["update_cum_energy"] = upd["cum_energy_M"]
    if P_DN is not None:  # paper 003 Fig. 3's view: the adapter product, not the weight change
        prod = _energy(aligned_update(base, W0, P_DN))
        vecs["product_update_c"], vecs["product_update_p"] = prod["c_M"], prod["p_M"]
        vecs["product_update_cum_energy"] = prod["cum_energy_M"]
    if A_RN is not None:
        ss = _similarity(A_RN, base, rank)
        scalars["subspace_sim_top"], scalars["subspace_sim_bottom"] = ss["sim_top"], ss["sim_bottom"]
    steps = []
    for step, A in sorted((A_steps or {}).items()):
        ss = _similarity(A, base, rank)
        steps += [{"matrix": name, "metric": f"subspace_sim_{w}_step", "index": int(step), "value": ss[f"sim_{w}"]}
                  for w in ("top", "bottom")]
    changed = bf16_changed_mask(W0, W1, eta)
    scalars["bf16_sparsity"] = 1.0 - float(changed.double().mean())
    svd0 = (base.U_top_DK, s0, base.Vh_top_KN)  # principal_mask reads the top k only
    m_princ, m_low = principal_mask(W0, k, alpha, svd0=svd0), low_magnitude_mask(W0, alpha)
    for tag, ref in (("principal", m_princ), ("low_magnitude", m_low),
                     ("principal_not_low", m_princ & ~m_low)):
        ov = mask_overlap(changed, ref)
        scalars[f"overlap_{tag}"], scalars[f"overlap_{tag}_baseline"] = ov["overlap"], ov["baseline"]
    rows = [{"matrix": name, "metric": m, "index": 0, "value": float(v)} for m, v in scalars.items()] + steps
    if vectors:
        for m, v in vecs.items():
            rows += [{"matrix": name, "metric": m, "index": i, "value": float(x)}
                     for i, x in enumerate(v.cpu().tolist())]
    return rows


def _ranks(A_RN, A_steps: Mapping[int, object] | None, rank: int | None) -> list[int]:
    """The singular vectors per side the subspace similarities need (0 without a LoRA A)."""
    if rank is not None:
        return [rank]
    return [0] + [a.shape[0] for a in [A_RN, *(A_steps or {}).values()] if a is not None]


def diagnose_model(pairs: Mapping[str, tuple], A_steps: Mapping[str, Mapping[int, object]] | None = None,
                   cache=None, **kwargs) -> pd.DataFrame:
    """Diagnostics of many matrices: pairs maps name -> (W0, W1, A_or_None[, (α/r)BA or None[, ΔW as a
    `LowRank` or None]]) (the product may be a `LowRank` too); A_steps name -> {training step: A}
    (`diagnose_matrix`); `cache`: a lorarl.diagnose.cache.BaseCache sharing W0's factors between cells (None:
    computed here); kwargs go to `diagnose_matrix`. Returns a long DataFrame with columns matrix, metric,
    index, value."""
    rows: list[dict] = []
    for name, (W0, W1, A, *rest) in pairs.items():
        steps = (A_steps or {}).get(name)
        need = max(kwargs.get("k", DEFAULT_K), *_ranks(A, steps, kwargs.get("rank")))
        device = kwargs.get("device")
        base = cache.get(name, W0.to(device) if device is not None else W0, need) if cache is not None else None
        rows += diagnose_matrix(name, W0, W1, A, P_DN=rest[0] if rest else None, A_steps=steps,
                                update=rest[1] if len(rest) > 1 else None, base=base, **kwargs)
    df = pd.DataFrame(rows, columns=["matrix", "metric", "index", "value"])
    return df.astype({"matrix": "string", "metric": "string", "index": "int64", "value": "float64"})


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write df to `path` atomically: a temporary file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
