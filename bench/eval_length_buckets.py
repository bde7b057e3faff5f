"""Evaluation batches bucketed by prompt length against batches in prompt order, side by side in one run (issue 48
item 3): pad tokens, wall seconds of transformers ``generate`` over every batch, and whether each prompt's greedy
completion is the same.

What runs: the HF evaluation backend's batching (lorarl.evaluate.backends.length_batches, re-stated here so this
script needs only torch and transformers): every prompt left-padded to its batch's longest, ``--batch`` prompts per
``generate`` call, greedy, ``--tokens`` new tokens with no EOS (every row decodes the full budget). ``buckets``:
prompts sorted longest first, then cut into batches; ``order``: cut in prompt order. Prompts: ``--prompts`` random
token rows whose lengths are drawn uniformly from ``--min-len``..``--max-len`` (seed 0, in random order, as a
benchmark's problems come). Model: a random-weights Qwen2 (``--hidden`` wide, ``--layers`` layers, vocabulary 1000),
float32 on the CPU (``--threads``, default 1), bfloat16 on CUDA. Each arm runs once untimed (warm-up), then
``--repeats`` times; the best time is kept. No threshold: ratios are printed.

    python bench/eval_length_buckets.py
    python bench/eval_length_buckets.py --hidden 1024 --layers 8 --prompts 256 --batch 32 --max-len 1024  # a GPU
"""

from __future__ import annotations

import argparse
import platform
import random
import time

import torch


def batches(lengths: list[int], size: int, by_length: bool) -> list[list[int]]:
    """Prompt indices per ``generate`` call: longest first (ties in prompt order), or prompt order."""
    idx = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)) if by_length else list(range(len(lengths)))
    return [idx[k:k + size] for k in range(0, len(idx), size)]


def run(model, prompts: list[list[int]], chunks: list[list[int]], tokens: int, device: str) -> dict[int, list[int]]:
    """Each prompt's generated tokens (greedy, no EOS), batch by batch, left-padded with token 0."""
    out: dict[int, list[int]] = {}
    for chunk in chunks:
        rows = [prompts[i] for i in chunk]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
        attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=tokens,
                                 min_new_tokens=tokens, pad_token_id=0, eos_token_id=None)
        out.update(zip(chunk, gen[:, width:].tolist()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=1000, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=max(args.hidden // 64, 1), num_key_value_heads=max(args.hidden // 128, 1),
                      intermediate_size=args.hidden * 3, max_position_embeddings=args.max_len + args.tokens + 8,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    rng = random.Random(0)
    lengths = [rng.randint(args.min_len, args.max_len) for _ in range(args.prompts)]
    prompts = [[rng.randrange(2, 1000) for _ in range(n)] for n in lengths]
    print(f"machine: {platform.machine()} {device} ({torch.get_num_threads()} threads), torch {torch.__version__}; "
          f"{args.prompts} prompts of {args.min_len}-{args.max_len} tokens, batch {args.batch}, {args.tokens} new "
          f"tokens, Qwen2 {args.hidden} wide x {args.layers} layers, {dtype}")
    got: dict[str, dict] = {}
    for arm, by_length in (("order", False), ("buckets", True)):
        chunks = batches(lengths, args.batch, by_length)
        pad = sum(max(lengths[i] for i in c) - lengths[i] for c in chunks for i in c)
        run(model, prompts, chunks, args.tokens, device)  # warm-up
        best = float("inf")
        for _ in range(args.repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = run(model, prompts, chunks, args.tokens, device)
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        got[arm] = {"pad": pad, "s": best, "out": out}
        print(f"{arm:8s} pad tokens {pad:7d} ({pad / (pad + sum(lengths)):.1%} of prompt positions)  {best:.3f} s")
    same = sum(got["order"]["out"][i] == got["buckets"]["out"][i] for i in range(args.prompts))
    o, b = got["order"], got["buckets"]
    print(f"buckets / order: pad tokens x{b['pad'] / max(o['pad'], 1):.3f}, wall x{b['s'] / o['s']:.3f}; "
          f"same greedy completion for {same}/{args.prompts} prompts")


if __name__ == "__main__":
    main()
