"""Resident packs against fixed packs and solo jobs: a study of cells of unequal lengths, side by side, one run.

    python bench/resident_packs.py                         # 16 cells: 8 of 20 steps, 8 of 60; K = 4
    python bench/resident_packs.py --short 2 --long 6      # a quick look

The study: 16 LoRA cells (8 seeds x lengths 20 and 60 steps, in that order, so every fixed pack of 4 holds two
short and two long cells) on the tiny local model the tests use (hidden 32, 2 layers), P = 2 prompts x G = 2
completions of 8 tokens. Three ways, one after another in this process, each into its own results folder:

* solo: each cell alone (a one-cell pack, :func:`lorarl.pack.run.train_alone`), one after another;
* fixed packs: the cells in packs of K in study order (:func:`lorarl.pack.run.train_pack`): a pack ends when its
  longest member does (the packs are formed without ``train.steps`` in the key, as lengths unknown when the packs
  are planned -- collapse stops, divergence, adaptive rungs -- would leave them; a Snakemake plan of these cells
  today packs the 20-step and the 60-step cells apart);
* resident: one job with K places over all 16 (:func:`lorarl.pack.resident.train_resident`).

The scheduling is what is measured: the hosts are driven in process (a Snakemake run would add the same job
start-up to each side). Every cell's metrics (all but wall-clock columns) and final adapter are checked equal to its
solo run (1e-6). Rewards: a deterministic score of the completion's text (tests/test_grpo.py's), since an untrained
tiny model is never right and its adapters would not move. One torch thread. Wall time and this process's CPU
seconds per way; ratios are within this one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import yaml

NOISY = ("time/", "pack/", "tokens_per_s", "step_time")  # wall-clock and pack size: not part of a cell's result


def text_score(completions, answers=None):
    """A deterministic, non-degenerate grade of a completion's text (the tests' fake_score)."""
    return [float(sum(map(ord, c)) % 5) / 4 for c in completions]


def save_tiny(d: Path) -> str:
    """The tests' tiny model and tokenizer (tests/tiny_model.py), saved in ``d``."""
    import torch

    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def study_cells(root: Path, model: str, short: int, long: int, seeds: int) -> list:
    from lorarl.study import cell_table, load_study

    doc = {"name": "rb", "defaults": {
        "model": model, "task": {"name": "synthetic", "seed": 7, "n_train": 24, "n_eval": 4, "max_value": 9},
        "adapter": {"method": "lora", "rank": 2, "alpha": 4, "dropout": 0.0},
        "train": {"prompts_per_step": 2, "generations": 2, "max_completion_length": 8, "lr": 1e-2,
                  "checkpoint_every": 0, "kl_monitor_every": 0}},
        "axes": {"seed": {"field": "seed", "prefix": "s", "values": list(range(seeds))},
                 "length": {"field": "train.steps", "prefix": "n", "values": [short, long]}}}
    p = root / "rb.yaml"
    p.write_text(yaml.safe_dump(doc))
    cells = list(cell_table(load_study(str(p))).cells)
    return sorted(cells, key=lambda c: (c.config.seed, c.config.train.steps))  # short, long, short, long, ...


def patch_rewards() -> None:
    """Outcome cells graded by :func:`text_score` (an untrained tiny model is never right)."""
    from lorarl.pack import build
    from lorarl.rewards.outcome import OutcomeDeposits

    real = build.build_pack

    def build_pack(*a, **kw):
        pack = real(*a, **kw)
        for m in pack.loop.members:
            if m.regime.name == "outcome":
                m.regime = OutcomeDeposits(score_fn=text_score)
        return pack

    build.build_pack = build_pack


def timed(fn) -> dict:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return {"wall_s": round(time.perf_counter() - w, 2), "cpu_s": round(time.process_time() - c, 2)}


def outputs(folder: Path) -> tuple:
    import pandas as pd
    from safetensors.torch import load_file

    rows = pd.read_csv(folder / "metrics.csv")
    rows = rows[[c for c in rows.columns if not c.startswith(NOISY)]]
    return load_file(str(folder / "adapter" / "adapter_model.safetensors")), rows


def pack_steps(cells: list, got: Path, staged: bool) -> float:
    """Steps the job's pack took (each member's row at a step carries ``pack/cells``, the members that took it): the
    job's device time where a step costs the same however many of its places are filled (an under-filled GPU)."""
    import pandas as pd

    total = 0.0
    for c in cells:
        rows = pd.read_csv(got / "rb" / c.id / (".packed" if staged else "") / "metrics.csv")
        total += float((1.0 / rows["pack/cells"]).sum())
    return round(total, 1)


def differences(cells: list, got: Path, want: Path, staged: bool) -> dict[str, float]:
    """Per cell: the largest difference of its metrics and adapter from its solo run's (inf: columns/steps differ)."""
    out = {}
    for c in cells:
        w, m = outputs(got / "rb" / c.id / (".packed" if staged else ""))
        w0, m0 = outputs(want / "rb" / c.id)
        if list(m.columns) != list(m0.columns) or len(m) != len(m0) or w.keys() != w0.keys():
            out[c.id] = float("inf")
            continue
        dm = float((m.to_numpy(dtype=float) - m0.to_numpy(dtype=float)).__abs__().max())
        out[c.id] = max(dm, max(float((w[k] - w0[k]).abs().max()) for k in w))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", type=int, default=20, help="steps of the short cells")
    ap.add_argument("--long", type=int, default=60, help="steps of the long cells")
    ap.add_argument("--seeds", type=int, default=8, help="seeds (cells = 2 x seeds)")
    ap.add_argument("--places", type=int, default=4, help="K: cells per fixed pack, places of the resident job")
    ap.add_argument("--out", default="bench/results/resident_packs.json")
    args = ap.parse_args()

    import torch

    from lorarl.pack.plan import pack_id
    from lorarl.pack.resident import train_resident
    from lorarl.pack.run import train_alone, train_pack

    torch.set_num_threads(1)
    load0 = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    patch_rewards()
    root = Path(tempfile.mkdtemp(prefix="resident-bench-"))
    try:
        model = save_tiny(root / "tiny")
        cells = study_cells(root, model, args.short, args.long, args.seeds)
        K = args.places
        packs = [cells[i:i + K] for i in range(0, len(cells), K)]
        dirs = {w: root / w for w in ("solo", "fixed", "resident")}
        runs = {
            "solo": timed(lambda: [train_alone("rb", c, dirs["solo"], threads=1) for c in cells]),
            "fixed": timed(lambda: [train_pack("rb", p, dirs["fixed"], threads=1, pack_id=pack_id([c.id for c in p]))
                                    for p in packs]),
            "resident": timed(lambda: train_resident("rb", cells, dirs["resident"], places=K, threads=1,
                                                     resident_id="pack-resident")),
        }
        ledger = json.loads((dirs["resident"] / "rb" / ".packs" / "pack-resident.ledger.json").read_text())
        diffs = {w: differences(cells, dirs[w], dirs["solo"], staged=True) for w in ("fixed", "resident")}
        for w in runs:
            runs[w]["pack_steps"] = pack_steps(cells, dirs[w], staged=w != "solo")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    worst = {w: max(d.values()) for w, d in diffs.items()}
    cell_steps = sum(c.config.train.steps for c in cells)
    result = {
        "cells": len(cells), "short_steps": args.short, "long_steps": args.long, "places": K, "cell_steps": cell_steps,
        "runs": runs, "resident_segments": len(ledger["segments"]),
        "ratios": {"resident/fixed wall": round(runs["resident"]["wall_s"] / runs["fixed"]["wall_s"], 3),
                   "resident/solo wall": round(runs["resident"]["wall_s"] / runs["solo"]["wall_s"], 3),
                   "fixed/solo wall": round(runs["fixed"]["wall_s"] / runs["solo"]["wall_s"], 3),
                   "resident/fixed cpu": round(runs["resident"]["cpu_s"] / runs["fixed"]["cpu_s"], 3),
                   "resident/solo cpu": round(runs["resident"]["cpu_s"] / runs["solo"]["cpu_s"], 3),
                   "resident/fixed pack-steps": round(runs["resident"]["pack_steps"] / runs["fixed"]["pack_steps"], 3)},
        "max_diff_from_solo": worst, "equal_to_solo": all(v <= 1e-6 for v in worst.values()),
        "machine": f"{platform.machine()} {platform.processor() or ''} {__import__('os').cpu_count()} CPUs; torch "
                   f"{torch.__version__}, 1 thread",
        "target": "resident wall <= 0.75 x fixed packs' wall",
        "load_average_before": load0,
    }
    for w, r in runs.items():
        print(f"{w:>9}: wall {r['wall_s']:8.1f} s   cpu {r['cpu_s']:8.1f} s   pack-steps {r['pack_steps']:7.1f}")
    for k, v in result["ratios"].items():
        print(f"{k:>22}: {v:.3f}")
    print(f"every cell equal to its solo run (1e-6): {result['equal_to_solo']} (largest difference: {worst})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    if not result["equal_to_solo"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
