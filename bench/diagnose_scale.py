"""The diagnose job of one cell at Qwen3-1.7B shapes, today's path vs the cached / Gram / low-rank path.

Random weights at the real shapes (lorarl.gpucheck.shapes.ARCHS["qwen3-1.7b"]; nothing downloaded), an
all-linear LoRA of rank 16 (B and A random, merged in float32 as peft does). Per matrix, side by side in one
process:
  today  : the diagnostics as the stage computed them before: float64 SVDs of W0 and of W+ (two full SVDs),
           then every metric from them (the package's pure functions, called as the old diagnose_matrix did);
  cell 1 : the new path on a cold cache: W0's digest, W0's float64 SVD reduced to BaseFactors and written to
           the cache (lorarl.diagnose.cache), then diagnose_matrix (W+'s spectrum from its Gram matrix, ΔW
           aligned through B and A);
  cell 2 : a second cell of the same base (another LoRA): a fresh cache object reads W0's factors from disk.
Each new row set is checked against today's (largest relative difference printed). The default runs two
matrices of one layer (minutes on 2 busy cores); `--modules all` runs a whole layer, and the totals are then
extrapolated to the model's 28 layers (every layer has the same shapes), which the output says.

    python bench/diagnose_scale.py                          # k_proj, v_proj of layer 0
    python bench/diagnose_scale.py --modules all --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shapes(arch_name: str) -> dict[str, tuple[int, int]]:
    """module -> (out_features, in_features) of one decoder layer."""
    from lorarl.gpucheck.shapes import ARCHS

    a = ARCHS[arch_name]
    hd = a.head_dim or a.hidden // a.heads
    return {"q_proj": (a.heads * hd, a.hidden), "k_proj": (a.kv_heads * hd, a.hidden),
            "v_proj": (a.kv_heads * hd, a.hidden), "o_proj": (a.hidden, a.heads * hd),
            "gate_proj": (a.intermediate, a.hidden), "up_proj": (a.intermediate, a.hidden),
            "down_proj": (a.hidden, a.intermediate)}


def today(W0, W1, A, k):
    """The old per-matrix computation: two float64 SVDs, every metric from them (rows not kept)."""
    import torch

    from lorarl.diagnose import weights as dg

    W0d, W1d = dg._f64(W0), dg._f64(W1)
    svd0, svd1 = dg.svd(W0d), dg.svd(W1d)
    out = {"spectral_drift": float(torch.linalg.vector_norm(svd1[1] - svd0[1]) / torch.linalg.vector_norm(svd0[1])),
           "rel_update_fro": float(torch.linalg.matrix_norm(W1d - W0d) / torch.linalg.matrix_norm(W0d))}
    pa = dg.principal_angles(W0d, W1d, k, svd0=svd0, svd1=svd1)
    out["max_angle_left_deg"], out["max_angle_right_deg"] = pa["max_angle_left_deg"], pa["max_angle_right_deg"]
    upd = dg.svd_aligned_update(W0d, W1d - W0d, svd0=svd0)
    out["update_c"] = upd["c_M"]
    ss = dg.subspace_similarity(A, W0d, svd0=svd0)
    out["subspace_sim_top"], out["subspace_sim_bottom"] = ss["sim_top"], ss["sim_bottom"]
    changed = dg.bf16_changed_mask(W0d, W1d)
    out["bf16_sparsity"] = 1.0 - float(changed.double().mean())
    m_princ, m_low = dg.principal_mask(W0d, k, svd0=svd0), dg.low_magnitude_mask(W0d)
    out["overlap_principal"] = dg.mask_overlap(changed, m_princ)["overlap"]
    out["overlap_low_magnitude"] = dg.mask_overlap(changed, m_low)["overlap"]
    out["overlap_principal_not_low"] = dg.mask_overlap(changed, m_princ & ~m_low)["overlap"]
    return out


def new(name, W0, W1, A, up, k, root, key):
    """One cell's new path: BaseCache.get (compute + write on a cold cache, read on a warm one), diagnose_matrix."""
    from lorarl.diagnose.cache import BaseCache
    from lorarl.diagnose.weights import diagnose_matrix

    cache = BaseCache(root, key)
    base = cache.get(name, W0, max(k, A.shape[0]))
    rows = diagnose_matrix(name, W0, W1, A, k=k, update=up, base=base)
    return rows, cache.stats


def _lora(D, N, r, seed):
    import torch

    from lorarl.diagnose.weights import LowRank

    g = torch.Generator().manual_seed(seed)
    B, A = 0.01 * torch.randn(D, r, generator=g), torch.randn(r, N, generator=g) / N ** 0.5
    return LowRank(B, A, 2.0)  # α = 32, r = 16


def _gap(rows, ref) -> float:
    """Largest |new − today| / max(|today|, 1e-12) over the scalars and the c vector."""
    import torch

    worst = 0.0
    for r in rows:
        if r["metric"] in ref and r["metric"] != "update_c" and r["index"] == 0:
            worst = max(worst, abs(r["value"] - ref[r["metric"]]) / max(abs(ref[r["metric"]]), 1e-12))
    c = torch.tensor([r["value"] for r in rows if r["metric"] == "update_c"], dtype=torch.float64)
    c_ref = ref["update_c"].cpu()
    return max(worst, float(((c - c_ref).abs() / c_ref.abs().max()).max()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen3-1.7b", help="a key of lorarl.gpucheck.shapes.ARCHS")
    ap.add_argument("--modules", default="k_proj,v_proj", help=f"comma list of {','.join(MODULES)}, or all")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the per-matrix rows to this file")
    args = ap.parse_args(argv)
    import torch

    from lorarl.adapters.svd_cache import tensor_digest
    from lorarl.gpucheck.shapes import ARCHS

    torch.set_num_threads(args.threads)
    mods = MODULES if args.modules == "all" else tuple(args.modules.split(","))
    shp = shapes(args.arch)
    k = 16
    rows_out = []
    with tempfile.TemporaryDirectory() as root:
        for i, mod in enumerate(mods):
            D, N = shp[mod]
            g = torch.Generator().manual_seed(100 + i)
            W0 = 0.02 * torch.randn(D, N, generator=g)
            name = f"model.layers.0.{'mlp' if mod in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{mod}"
            row = {"module": mod, "shape": [D, N]}
            for cell, seed in (("cell1", 1), ("cell2", 2)):
                up = _lora(D, N, args.rank, seed + 10 * i)
                W1 = W0 + up.s * (up.B_DR @ up.A_RN)  # float32 merge, as peft's merge_and_unload
                t0 = time.perf_counter()
                ref = today(W0, W1, up.A_RN, k)
                row[f"today_{cell}_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                digest = tensor_digest(W0)
                row[f"digest_{cell}_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                rows, stats = new(name, W0, W1, up.A_RN, up, k, root, "bench")
                row[f"new_{cell}_s"] = time.perf_counter() - t0 + row[f"digest_{cell}_s"]
                row[f"new_{cell}_svd_s"] = stats["svd_seconds"]
                row[f"gap_{cell}"] = _gap(rows, ref)
                assert digest and stats["misses"] == (cell == "cell1")
            row["cache_MiB"] = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root)
                                   for f in fs if f.startswith(name)) / 2**20
            rows_out.append(row)
            print(f"{mod} {D}x{N}: today {row['today_cell1_s']:.1f}/{row['today_cell2_s']:.1f} s, "
                  f"new cell 1 {row['new_cell1_s']:.1f} s, cell 2 {row['new_cell2_s']:.1f} s", file=sys.stderr, flush=True)
    a = ARCHS[args.arch]
    print(f"Diagnose job of one cell, {args.arch} shapes (random weights), all-linear LoRA rank {args.rank}, "
          f"k = {k}, CPU, {args.threads} threads\n")
    print("| matrix | shape | today (s) | new, cell 1 (s) | of which W0's SVD (s) | new, cell 2 (s) | today / cell 2 "
          "| today / cell 1 | cache (MiB) | max rel. diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tot = {"today": 0.0, "c1": 0.0, "c2": 0.0, "mib": 0.0}
    for r in rows_out:
        t = (r["today_cell1_s"] + r["today_cell2_s"]) / 2
        tot["today"] += t
        tot["c1"] += r["new_cell1_s"]
        tot["c2"] += r["new_cell2_s"]
        tot["mib"] += r["cache_MiB"]
        print(f"| {r['module']} | {r['shape'][0]}x{r['shape'][1]} | {t:.1f} | {r['new_cell1_s']:.1f} | "
              f"{r['new_cell1_svd_s']:.1f} | {r['new_cell2_s']:.1f} | {t / r['new_cell2_s']:.1f}x | "
              f"{t / r['new_cell1_s']:.1f}x | {r['cache_MiB']:.0f} | {max(r['gap_cell1'], r['gap_cell2']):.1e} |")
    print(f"| **total** | {len(rows_out)} matrices | {tot['today']:.1f} | {tot['c1']:.1f} | | {tot['c2']:.1f} | "
          f"{tot['today'] / tot['c2']:.1f}x | {tot['today'] / tot['c1']:.1f}x | {tot['mib']:.0f} | |")
    if len(rows_out) == len(MODULES):
        L = a.layers
        print(f"\nExtrapolated to the whole model ({L} layers x {len(MODULES)} matrices, every layer the same shapes; "
              f"weight loading and the model digest left out, the same for both): today {tot['today'] * L / 3600:.1f} h, "
              f"new cell 1 {tot['c1'] * L / 3600:.1f} h, new cell 2 {tot['c2'] * L / 3600:.2f} h per cell; "
              f"W0's cache {tot['mib'] * L / 1024:.1f} GiB per base.")
    else:
        print(f"\nSubset: {', '.join(mods)} of one layer; `--modules all` times a whole layer and extrapolates.")
    print("today = average of the two cells (today's path recomputes W0's SVD for each); "
          "max rel. diff = largest |new − today| / |today| over the scalar metrics and c_i / max c.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows_out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
