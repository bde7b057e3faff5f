"""When does a vLLM pack beat solo runs? Rollout tokens/s of K adapters in one LoRA engine against K merged solo
engines, for K in {1, 2, 4, 8} and max rank in {1, 8, 64, 256}, on vLLM's real engine (its CPU build here).

Runs in the venv holding vLLM (``.venv-vllm``, scripts/vllm_cpu.sh). One engine per process (vLLM's rule), so the
script starts itself once per engine (``--worker``):

* the model: bench/vllm_rollouts.py's Qwen2 of ``local:tiny-arith``'s family (default hidden 256, 4 layers, heads of
  32), random weights, float32, eager, the in-process executor (as a pack's engine, lorarl.pack.vllm_rollouts);
* solo: an engine without LoRA serving the base (a merged solo cell has the same shapes, so the same cost)
  generates ONE member's batch (``--prompts`` prompts x G = 4 completions); K solo engines on one device run one
  after another, so their tokens/s is this engine's;
* pack at max rank r: one engine with ``enable_lora``, ``max_lora_rank`` r, ``max_loras`` 8 (the largest K, for
  every K: one engine per rank; a pack's own engine has ``max_loras`` = K), 8 adapters of rank r on every linear
  layer (B off zero); K members' batches in ONE ``generate`` call, member k's prompts with adapter k, as
  lorarl.pack.multilora builds them;
* every row decodes exactly ``--tokens`` tokens (``ignore_eos``), temperature 1, seeded; ``--repeats`` timed
  calls after a warm-up; tokens/s = tokens / wall seconds, and per CPU second of the engine's process (what other
  load on a shared machine does not inflate).

The ratio pack/solo (tokens/s, median over repeats) is the table: below 1, the pack loses to solo runs. ``--table``
writes it where the packer reads it (bench/results/vllm_pack_breakeven-cpu.json: lorarl.pack.breakeven), which
decides by ``decide``: on the CPU build ``ratio_cpu`` (tokens per CPU-second: the engine computes on one thread, so
on an idle machine that is its tokens/s, and the engines, measured one after another, are not compared under
different loads of a shared machine); on a GPU it would be ``ratio`` (wall).

    .venv-vllm/bin/python bench/vllm_pack_breakeven.py --table bench/results/vllm_pack_breakeven-cpu.json
    .venv-vllm/bin/python bench/vllm_pack_breakeven.py --quick --json o.json     # seconds; what the test runs
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.vllm_rollouts, run as a script from anywhere

G = 4  # completions per prompt
KS = (1, 2, 4, 8)
RANKS = (1, 8, 64, 256)
QUICK = dict(hidden=64, layers=1, prompts=1, tokens=4, repeats=1, ks=(1, 2), ranks=(1, 8))


def adapters(root: str, model_dir: str, rank: int, count: int) -> list[str]:
    """``count`` PEFT LoRA folders of rank ``rank`` on every linear layer, B off zero (trained adapters)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = []
    for k in range(count):
        torch.manual_seed(100 + k)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                               LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                          init_lora_weights=False))
        path = f"{root}/lora-r{rank}-{k}"
        model.save_pretrained(path)
        out.append(path)
    return out


def worker(a: argparse.Namespace) -> dict:
    """One engine: solo (``--rank 0``) or LoRA at ``--rank``; every K of ``--ks`` timed ``--repeats`` times."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from lorarl.evaluate.vllm_backend import inprocess_engine_kwargs

    torch.set_num_threads(a.threads)
    root = tempfile.mkdtemp(prefix="bench_breakeven_")
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    from bench.vllm_rollouts import build_model

    model_dir = build_model(root, a.hidden, a.layers)
    kmax = max(a.ks)
    lora = {} if a.rank == 0 else dict(enable_lora=True, max_lora_rank=a.rank, max_loras=kmax, max_cpu_loras=kmax)
    paths = adapters(root, model_dir, a.rank, kmax) if a.rank else []
    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.15, max_model_len=256,
              seed=0, **lora, **inprocess_engine_kwargs())
    reqs = [LoRARequest(f"m{k}", k + 1, p) for k, p in enumerate(paths)]
    prompts = [[5 + (7 * i + j) % 40 for j in range(12)] for i in range(kmax * a.prompts)]

    def call(k_members: int) -> int:
        rows, params, loras = [], [], []
        for k in range(k_members):
            for i in range(a.prompts):
                rows.append({"prompt_token_ids": prompts[k * a.prompts + i]})
                params.append(SamplingParams(n=G, temperature=1.0, max_tokens=a.tokens, ignore_eos=True,
                                             seed=1000 * k + i))
                loras.append(reqs[k] if reqs else None)
        outs = llm.generate(rows, params, use_tqdm=False, lora_request=loras if reqs else None)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    ks = [1] if a.rank == 0 else list(a.ks)
    got = {}
    for k in ks:
        call(k)  # warm-up: the adapters into their slots, the first schedule of this batch shape
        runs = []
        for _ in range(a.repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            n = call(k)
            runs.append((n, time.perf_counter() - w0, time.process_time() - c0))
        got[str(k)] = {"tokens": [r[0] for r in runs], "wall": [r[1] for r in runs], "cpu": [r[2] for r in runs]}
        print(f"[bench] rank {a.rank} K {k}: {runs[-1][0]} tokens in {runs[-1][1]:.2f} s", file=sys.stderr, flush=True)
    return got


def run(a: argparse.Namespace) -> dict:
    """Every engine in its own process: solo first, then one per rank."""
    engines = {}
    for rank in (0, *a.ranks):
        cmd = [sys.executable, __file__, "--worker", "--rank", str(rank), "--hidden", str(a.hidden), "--layers",
               str(a.layers), "--prompts", str(a.prompts), "--tokens", str(a.tokens), "--repeats", str(a.repeats),
               "--threads", str(a.threads), "--ks", *map(str, a.ks)]
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
        if p.returncode != 0:
            raise SystemExit(f"engine at rank {rank} failed:\n{p.stderr[-4000:]}")
        engines[rank] = json.loads(p.stdout.strip().splitlines()[-1])

    def rate(d: dict, per: str) -> float:
        return statistics.median(n / t for n, t in zip(d["tokens"], d[per]))

    solo = {per: rate(engines[0]["1"], per) for per in ("wall", "cpu")}
    ratio = {str(r): {str(k): rate(engines[r][str(k)], "wall") / solo["wall"] for k in a.ks} for r in a.ranks}
    ratio_cpu = {str(r): {str(k): rate(engines[r][str(k)], "cpu") / solo["cpu"] for k in a.ks} for r in a.ranks}
    import torch
    import vllm

    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads {a.threads}, "
               f"load avg {os.getloadavg()[0]:.1f}; vLLM {vllm.__version__} CPU build, torch {torch.__version__}")
    return {"device": "cpu", "machine": machine, "decide": "ratio_cpu",  # the packer's ratio: see the docstring
            "command": "bench/vllm_pack_breakeven.py " + " ".join(sys.argv[1:]),
            "model": {"hidden": a.hidden, "layers": a.layers, "prompts_per_member": a.prompts, "generations": G,
                      "tokens_per_row": a.tokens, "adapters": "LoRA on every linear layer"},
            "solo_tokens_per_s": solo["wall"], "solo_tokens_per_cpu_s": solo["cpu"],
            "ratio": ratio, "ratio_cpu": ratio_cpu,
            "pack_tokens_per_s": {str(r): {k: rate(v, "wall") for k, v in engines[r].items()} for r in a.ranks}}


def report(r: dict) -> None:
    m = r["model"]
    print(f"model: Qwen2 hidden {m['hidden']} x {m['layers']} layers, fp32; per member {m['prompts_per_member']} "
          f"prompts x {m['generations']} rows x {m['tokens_per_row']} tokens; {m['adapters']}")
    print(f"machine: {r['machine']}")
    print(f"solo engine (merged, no LoRA): {r['solo_tokens_per_s']:.0f} tokens/s, "
          f"{r['solo_tokens_per_cpu_s']:.0f} tokens/CPU-s")
    ks = list(next(iter(r["ratio"].values())))
    print("pack tokens/s / solo tokens/s (wall; CPU-seconds in brackets); < 1: the pack loses to solo runs")
    print(f"{'max rank':>8} " + " ".join(f"{'K=' + k:>14}" for k in ks))
    for rank, row in r["ratio"].items():
        print(f"{rank:>8} " + " ".join(f"{row[k]:7.2f} [{r['ratio_cpu'][rank][k]:4.2f}]" for k in ks))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per member (G = 4 rows each)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS))
    ap.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="tiny shape, K 1-2, ranks 1 and 8: checks the script runs")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--table", help="write the table the packer reads (lorarl.pack.breakeven) here")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    r = run(a)
    report(r)
    for path in (a.json, a.table):
        if path:
            Path(path).write_text(json.dumps(r, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
