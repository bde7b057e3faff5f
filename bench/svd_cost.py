"""SVD preprocessing cost of the SVD-based inits/masks per model size (cf. paper 003, Table 7).

Builds random Qwen2-architecture models of a few sizes locally (no download), then runs the exact code
path of a cell - `lorarl.adapters.svd_cache.SVDCache` over every all-linear target weight - once cold
(SVD computed and written to the disk cache) and once warm (read back), each size in a fresh process
so peak memory is per size. Prints a markdown table; `--json` also writes the rows.

    python bench/svd_cost.py                       # sizes xs,s,m on the default device
    python bench/svd_cost.py --sizes xs,s,m,l --rank 32 --dtype bfloat16 --device cuda

Peak memory: CUDA = torch.cuda.max_memory_allocated during the SVD pass; CPU = growth of the process's
peak RSS during the pass (ru_maxrss), i.e. what the SVDs and the cache add on top of the loaded model.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time

SIZES = {  # name: (hidden, intermediate, layers, heads, kv_heads); vocab 1024 so linears dominate
    "xs": (128, 256, 4, 4, 2),  # the tiny-arith shape
    "s": (256, 1024, 4, 4, 2),
    "m": (512, 2048, 6, 8, 2),
    "l": (1024, 4096, 8, 16, 4),
    "xl": (1536, 8960, 4, 12, 2),  # one 4-layer slice of Qwen2-1.5B's shapes
}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _one(size: str, rank: int, dtype: str, device: str, threads: int, q) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lorarl.adapters.ops import target_linears
    from lorarl.adapters.svd_cache import SVDCache, model_key, param_digests

    torch.set_num_threads(threads)
    h, inter, layers, heads, kv = SIZES[size]
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=1024, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=getattr(torch, dtype)).eval()
    targets = target_linears(model, "all-linear")
    n_params = sum(p.numel() for p in model.parameters())
    n_target = sum(m.weight.numel() for _, m in targets)
    torch.linalg.svd(torch.randn(64, 32, device=device), full_matrices=False)  # one-time library init
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        digests = param_digests(model)
        key = model_key(digests=digests)
        t_digest = time.perf_counter() - t0
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base_mem = torch.cuda.memory_allocated()
        rss0 = _rss_mb()
        cold = SVDCache(root, key)
        t0 = time.perf_counter()
        for name, mod in targets:
            cold.get(name, mod.weight, rank, digest=digests[name + ".weight"])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base_mem) / 2**20
        else:
            peak = _rss_mb() - rss0
        t_cold = time.perf_counter() - t0
        warm = SVDCache(root, key)
        t0 = time.perf_counter()
        for name, mod in targets:
            warm.get(name, mod.weight, rank, digest=digests[name + ".weight"])
        t_warm = time.perf_counter() - t0
        disk = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root) for f in fs) / 2**20
    q.put({"size": size, "hidden": h, "intermediate": inter, "layers": layers, "params_M": n_params / 1e6,
           "target_matrices": len(targets), "target_params_M": n_target / 1e6, "digest_s": t_digest,
           "svd_cold_s": t_cold, "svd_compute_s": cold.stats["svd_seconds"], "cache_warm_s": t_warm,
           "hits_warm": warm.stats["hits"], "peak_mem_MiB": peak, "cache_disk_MiB": disk,
           "device": device, "dtype": dtype, "rank": rank, "threads": threads})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="xs,s,m", help=f"comma list of {','.join(SIZES)}")
    ap.add_argument("--rank", type=int, default=32, help="largest rank the cells need (cache keeps >= 64)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    ctx = mp.get_context("spawn")
    rows = []
    for size in args.sizes.split(","):
        q = ctx.Queue()
        p = ctx.Process(target=_one, args=(size, args.rank, args.dtype, device, args.threads, q))
        p.start()
        rows.append(q.get())
        p.join()
    print(f"SVD preprocessing cost: all-linear targets, keep top/bottom >= max(64, r={args.rank}) vectors, "
          f"{args.dtype} weights, {device}, {args.threads} threads\n")
    print("| model | params (M) | target matrices | SVD compute (s) | cold: SVD + write (s) | warm: cache read (s) "
          "| peak mem (MiB) | cache on disk (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = f"{r['size']} (h={r['hidden']}, ff={r['intermediate']}, L={r['layers']})"
        print(f"| {name} | {r['params_M']:.1f} | {r['target_matrices']} | {r['svd_compute_s']:.2f} | "
              f"{r['svd_cold_s']:.2f} | "
              f"{r['cache_warm_s']:.2f} | {r['peak_mem_MiB']:.0f} | {r['cache_disk_MiB']:.1f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
