"""Packed vs solo cells on a CPU twin of the demo: held-out accuracy and study wall time, side by side.

    python bench/packed_twin.py --model results/models/tiny-arith [--seeds 0,1,2] [--steps 40] [--workdir DIR]

Runs ONE study (demo shape: tiny-arith, LoRA r = 8, β ∈ {0, 0.05} × seeds, P = 8 prompts × G = 4, 40
completion tokens, pass@1 on the synthetic held-out split) twice through Snakemake with 2 cores: once
with ``--config pack=K`` (K = all cells of a β: the packed trainer, lorarl.pack) and once with packing
off (every cell its own job with the TRL-based solo trainer). Prints each cell's held-out pass@1, the
mean ± sd over seeds per β for both, their difference, and the two studies' wall times (same machine,
same run; the solo run first). ``--model``: a built tiny base (the ``base_model`` rule's output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def study(model: str, seeds: list[int], steps: int, n_eval: int) -> dict:
    return {"name": "twin", "defaults": {
        "model": model, "task": {"name": "synthetic", "seed": 1234, "n_train": 2000, "n_eval": n_eval},
        "adapter": {"method": "lora", "rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "train": {"lr": 5e-4, "steps": steps, "prompts_per_step": 8, "generations": 4, "max_completion_length": 40,
                  "temperature": 1.0, "loss_type": "grpo", "checkpoint_every": 0},
        "eval": {"max_new_tokens": 40}},
        "axes": {"kl": {"field": "train.beta", "prefix": "kl", "values": [0.0, 0.05]},
                 "seed": {"field": "seed", "prefix": "s", "values": seeds}}}


def run(wd: Path, pack: int) -> float:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(wd),
           "--configfile", str(wd / "config.yaml"), "--cores", "2", "all", "--config", f"pack={pack}"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    return time.perf_counter() - t


def accuracies(wd: Path) -> dict[str, float]:
    out = {}
    for d in sorted((wd / "results" / "twin").glob("kl*-s*")):
        out[d.name] = json.loads((d / "eval" / "synthetic.json").read_text())["metrics"]["pass@1"]["value"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a built tiny base model folder (config.json + tokenizer)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--n-eval", type=int, default=200)
    ap.add_argument("--workdir", default="bench_twin")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    root = Path(a.workdir).resolve()
    walls, acc = {}, {}
    for mode, pack in (("solo", 1), ("packed", len(seeds))):
        wd = root / mode
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "study.yaml").write_text(yaml.safe_dump(study(str(Path(a.model).resolve()), seeds, a.steps, a.n_eval)))
        (wd / "config.yaml").write_text(yaml.safe_dump({"studies": [str(wd / "study.yaml")], "results": "results",
                                                         "launcher": "local", "slurm": {}}))
        walls[mode] = run(wd, pack)
        acc[mode] = accuracies(wd)
        print(f"{mode}: study wall {walls[mode]:.0f} s", flush=True)
    print(f"\n| cell | solo pass@1 | packed pass@1 |\n|---|---:|---:|")
    for c in acc["solo"]:
        print(f"| {c} | {acc['solo'][c]:.3f} | {acc['packed'].get(c, float('nan')):.3f} |")
    print("\n| β | solo mean ± sd | packed mean ± sd | packed − solo |\n|---|---|---|---:|")
    for kl in ("kl0", "kl0.05"):
        s = [v for c, v in acc["solo"].items() if c.startswith(kl + "-")]
        p = [v for c, v in acc["packed"].items() if c.startswith(kl + "-")]
        sd = (lambda x: statistics.stdev(x) if len(x) > 1 else 0.0)
        print(f"| {kl[2:]} | {statistics.mean(s):.3f} ± {sd(s):.3f} | {statistics.mean(p):.3f} ± {sd(p):.3f} | "
              f"{statistics.mean(p) - statistics.mean(s):+.3f} |")
    print(f"\nstudy wall time (Snakemake, 2 cores, training + evaluation + diagnose + aggregate): solo "
          f"{walls['solo']:.0f} s, packed {walls['packed']:.0f} s, ratio {walls['packed'] / walls['solo']:.2f}")


if __name__ == "__main__":
    main()
