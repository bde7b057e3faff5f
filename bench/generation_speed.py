"""Decoded tokens/s of the HF engine: today's dynamic KV cache against ``runtime.generation``'s static cache,
eager and compiled (issue 49 item 1), side by side in one run.

What runs: transformers ``generate`` exactly as lorarl's training rollouts call it (lorarl.train.rowsample: one
chunk, ``do_sample=False`` with lorarl's row sampler drawing each row's token at its pre-drawn uniform,
temperature 1, top-p 0.95), the generation config set by :func:`lorarl.decoding.apply` for each engine setting:

* ``today``: ``cache: dynamic`` (transformers' default cache, uncompiled; what every HF path ran before);
* ``static``: ``cache: static, compile: off`` (preallocated cache, fixed shapes, eager);
* ``static+compile``: ``cache: static, compile: on`` (the decode step through ``torch.compile``, inductor; CUDA
  graphs on CUDA, transformers' ``reduce-overhead`` mode).

Models (random weights, nothing downloaded): ``tiny`` = the tiny-arith recipe's shape (lorarl.models.TinyRecipe:
128 wide, 4 layers, vocabulary 300) and ``qwen3-1.7b`` = Qwen3-1.7B's shapes (lorarl.gpucheck.shapes.ARCHS: 2048
wide, 16 heads, 8 KV heads, head_dim 128, MLP 6144, vocabulary 151,936), at ``--twin-layers`` layers (28 = the
real depth; fewer on a CPU, printed). Rows: 16 and 128, prompts of 16-31 tokens (left-padded), ``--tokens`` new
tokens, no EOS (every row decodes the full budget). Each (model, rows, engine) runs once untimed (warm-up: the
compile, the allocator) and then ``--repeats`` times; the best time is kept. Tokens/s = rows x tokens / seconds.
Every engine's tokens are compared with today's (``same``: all rows equal). No threshold: ratios are printed.

    PYTHONPATH=. python bench/generation_speed.py                        # CPU: twin at 2 layers, 16 tokens
    PYTHONPATH=. python bench/generation_speed.py --twin-layers 28 --tokens 128   # a GPU: the real depth

On CUDA the models run in bfloat16, on the CPU in float32 (``--threads``, default 1).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

ENGINES = {"today": ("dynamic", "off"), "static": ("static", "off"), "static+compile": ("static", "on")}


def build(name: str, layers: int, device: str, dtype: torch.dtype):
    """A random-weights model of ``name`` (``tiny`` or an ARCHS key), eval mode, on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from lorarl.models import TinyRecipe, build_tiny

    torch.manual_seed(0)
    if name == "tiny":
        model = build_tiny(TinyRecipe(), 300, 1, 0)
    else:
        from lorarl.gpucheck.shapes import ARCHS

        a = ARCHS[name]
        cfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=layers, num_attention_heads=a.heads,
                          num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate, head_dim=a.head_dim,
                          tie_word_embeddings=a.tie, max_position_embeddings=4096, eos_token_id=1, pad_token_id=0,
                          bos_token_id=1)
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    return model.to(device=device, dtype=dtype).eval()


def decode(model, ids_NP, mask_NP, u_NT, engine: str) -> tuple[torch.Tensor, float]:
    """One generate call under ``engine`` (a key of ENGINES): its new tokens and seconds."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import TopPLogitsWarper

    from lorarl.decoding import GenerationEngine, apply, plan
    from lorarl.train.rowsample import RowSampler

    dev = ids_NP.device
    cache, comp = ENGINES[engine]
    steps = u_NT.size(1)
    cfg = GenerationConfig(do_sample=False, max_new_tokens=steps, min_new_tokens=steps, eos_token_id=None,
                           pad_token_id=0)
    apply(cfg, plan(GenerationEngine(cache=cache, compile=comp), model, dev.type), dev.type)
    sampler = RowSampler(u_NT.to(dev), ids_NP.size(1), [TopPLogitsWarper(top_p=0.95, min_tokens_to_keep=1)])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids_NP, attention_mask=mask_NP, generation_config=cfg, logits_processor=[sampler])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return out[:, ids_NP.size(1):].cpu(), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per row")
    ap.add_argument("--twin-layers", type=int, default=None, help="the 1.7B twin's depth (default: 28 on CUDA, 2 on a CPU)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["tiny", "qwen3-1.7b"])
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (a shared box: 1 thread, no oversubscription)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layers = a.twin_layers or (28 if device == "cuda" else 2)
    where = torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    print(f"device: {where}; torch {torch.__version__}; dtype {dtype}; {a.tokens} new tokens per row; "
          f"qwen3-1.7b twin at {layers} of 28 layers; best of {a.repeats} after one warm-up", flush=True)
    rows_out = []
    for name in a.models:
        model = build(name, layers, device, dtype)
        for n in a.rows:
            g = torch.Generator().manual_seed(n)
            lens = torch.randint(16, 32, (n,), generator=g).tolist()
            width = max(lens)
            ids_NP = torch.zeros((n, width), dtype=torch.long)
            mask_NP = torch.zeros((n, width), dtype=torch.long)
            for i, L in enumerate(lens):
                ids_NP[i, width - L:] = torch.randint(2, min(model.config.vocab_size, 300), (L,), generator=g)
                mask_NP[i, width - L:] = 1
            ids_NP, mask_NP = ids_NP.to(device), mask_NP.to(device)
            u_NT = torch.rand((n, a.tokens), generator=g, dtype=torch.float64)
            ref = None
            base_tps = None
            for engine in a.engines:
                t_warm = decode(model, ids_NP, mask_NP, u_NT, engine)[1]
                best, toks = float("inf"), None
                for _ in range(a.repeats):
                    toks, s = decode(model, ids_NP, mask_NP, u_NT, engine)
                    best = min(best, s)
                tps = n * a.tokens / best
                ref = toks if ref is None else ref
                base_tps = tps if base_tps is None else base_tps
                row = {"model": name, "rows": n, "engine": engine, "tokens_per_s": round(tps, 1),
                       "ratio_vs_today": round(tps / base_tps, 2), "warmup_s": round(t_warm, 2),
                       "same_tokens": bool(torch.equal(toks, ref))}
                rows_out.append(row)
                print(f"{name:>11} rows {n:>4} {engine:>15}: {tps:10.1f} tokens/s  x{tps / base_tps:5.2f} vs today  "
                      f"(warm-up {t_warm:6.2f} s; same tokens as today: {'yes' if row['same_tokens'] else 'NO'})",
                      flush=True)
        del model
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": where, "dtype": str(dtype), "tokens": a.tokens, "twin_layers": layers,
                       "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
