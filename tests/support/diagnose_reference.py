"""The diagnose stage's per-matrix computation as it was before the base cache and the Gram / low-rank paths:
two float64 SVDs (W0 and W+) per matrix. Kept here, not in the package, as the reference the fast path must
equal within the tolerances of docs/report.md (tests/test_diagnose_fast.py)."""

from __future__ import annotations


import torch

from lorarl.diagnose import weights as dg


def reference_rows(name, W0_DN, W1_DN, A_RN=None, rank=None, k=dg.DEFAULT_K, alpha=dg.DEFAULT_ALPHA,
                   eta=dg.BF16_ETA, P_DN=None, A_steps=None) -> list[dict]:
    W0 = dg._f64(W0_DN)
    W1 = dg._f64(W1_DN).to(W0.device)
    svd0, svd1 = dg.svd(W0), dg.svd(W1)
    s0, s1 = svd0[1], svd1[1]
    scalars = {
        "spectral_drift": float(torch.linalg.vector_norm(s1 - s0) / torch.linalg.vector_norm(s0)),
        "rel_update_fro": float(torch.linalg.matrix_norm(W1 - W0) / torch.linalg.matrix_norm(W0)),
    }
    vecs = {"sigma_base": s0, "sigma_tuned": s1}
    pa = dg.principal_angles(W0, W1, k, svd0=svd0, svd1=svd1)
    scalars["max_angle_left_deg"] = pa["max_angle_left_deg"]
    scalars["max_angle_right_deg"] = pa["max_angle_right_deg"]
    vecs["cos_left"], vecs["cos_right"] = pa["cos_left_K"], pa["cos_right_K"]
    upd = dg.svd_aligned_update(W0, W1 - W0, svd0=svd0)
    vecs["update_c"], vecs["update_p"], vecs["update_cum_energy"] = upd["c_M"], upd["p_M"], upd["cum_energy_M"]
    if P_DN is not None:
        prod = dg.svd_aligned_update(W0, P_DN, svd0=svd0)
        vecs["product_update_c"], vecs["product_update_p"] = prod["c_M"], prod["p_M"]
        vecs["product_update_cum_energy"] = prod["cum_energy_M"]
    if A_RN is not None:
        ss = dg.subspace_similarity(A_RN, W0, rank, svd0=svd0)
        scalars["subspace_sim_top"], scalars["subspace_sim_bottom"] = ss["sim_top"], ss["sim_bottom"]
    steps = []
    for step, A in sorted((A_steps or {}).items()):
        ss = dg.subspace_similarity(A, W0, rank, svd0=svd0)
        steps += [{"matrix": name, "metric": f"subspace_sim_{w}_step", "index": int(step), "value": ss[f"sim_{w}"]}
                  for w in ("top", "bottom")]
    changed = dg.bf16_changed_mask(W0, W1, eta)
    scalars["bf16_sparsity"] = 1.0 - float(changed.double().mean())
    m_princ, m_low = dg.principal_mask(W0, k, alpha, svd0=svd0), dg.low_magnitude_mask(W0, alpha)
    for tag, ref in (("principal", m_princ), ("low_magnitude", m_low), ("principal_not_low", m_princ & ~m_low)):
        ov = dg.mask_overlap(changed, ref)
        scalars[f"overlap_{tag}"], scalars[f"overlap_{tag}_baseline"] = ov["overlap"], ov["baseline"]
    rows = [{"matrix": name, "metric": m, "index": 0, "value": float(v)} for m, v in scalars.items()] + steps
    for m, v in vecs.items():
        rows += [{"matrix": name, "metric": m, "index": i, "value": float(x)} for i, x in enumerate(v.cpu().tolist())]
    return rows
