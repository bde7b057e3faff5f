"""Packed cells vs one process per cell: wall time, per-cell step time, peak memory, side by side.

    python bench/packed.py [--ks 1,2,4,8] [--steps 20]

Cells of the demo shape (tiny-arith architecture: hidden 128, 4 layers; LoRA r=8 on all linear
layers; 8 prompts x 4 completions, ~24 prompt + 40 completion tokens) train the GRPO UPDATE
(forward, per-cell loss with a KL term, backward, per-cell clipping and AdamW step) on scored
batches for the same number of steps, three ways, every one in fresh processes (a solo job pays its
process start, imports and base build as a real job does):

* packed: one process, ``lorarl.pack.PackedTrainer`` with K cells;
* sequential: K processes one after another, each a pack of one (= the solo update path);
* 2 at a time: the same K processes, two running at once (the machine's 2 cores).

Scope: rollout generation and reward scoring are NOT in this figure (the packed trainer does not
generate yet); it measures what packing changes in the update and the per-job fixed costs. Peak
memory is each process's max RSS. Ratios are taken within one run, so machine load hits all sides.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

P, G, PROMPT, COMPLETION, RANK = 8, 4, 24, 40, 8


def worker(k: int, steps: int, seed0: int) -> dict:
    """One job: build the base and K cells, train ``steps`` updates, report step times and max RSS."""
    t0 = time.perf_counter()
    import torch
    from peft import LoraConfig, get_peft_model

    from lorarl.models import TinyRecipe, build_tiny
    from lorarl.pack.loss import LossSettings
    from lorarl.pack.trainer import PackCell, PackedTrainer

    torch.set_num_threads(1)
    vocab = 320
    torch.manual_seed(0)
    base = build_tiny(TinyRecipe(), vocab, 1, 0)
    state = base.state_dict()
    shared = dict(base.named_parameters())  # before cell 0 wraps the base in place
    cells = []
    for i in range(k):
        torch.manual_seed(seed0 + i)
        m = base if i == 0 else build_tiny(TinyRecipe(), vocab, 1, 0)
        if i:
            m.load_state_dict(state)
            for n, p in m.named_parameters():  # share the frozen base storage with cell 0 (no copy)
                p.data = shared[n].data
        cfg = LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules="all-linear",
                         task_type="CAUSAL_LM")
        pm = get_peft_model(m, cfg)
        opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-3)
        cells.append(PackCell(f"c{i}", pm, opt, LossSettings(beta=0.01, max_completion_length=COMPLETION)))
    pack = PackedTrainer(cells, pad_token_id=0, fused_lm_head=False)
    g = torch.Generator().manual_seed(seed0)
    B = P * G

    def batch():
        return {"prompt_ids": torch.randint(2, vocab, (B, PROMPT), generator=g),
                "prompt_mask": torch.ones(B, PROMPT, dtype=torch.long),
                "completion_ids": torch.randint(2, vocab, (B, COMPLETION), generator=g),
                "completion_mask": torch.ones(B, COMPLETION, dtype=torch.long),
                "advantages": torch.randn(B, COMPLETION, generator=g),
                "lorarl_ref_logps": -torch.rand(B, COMPLETION, generator=g) * 5}

    setup = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        bs = [batch() for _ in range(k)]
        t = time.perf_counter()
        pack.step(bs)
        times.append(time.perf_counter() - t)
    return {"setup_s": setup, "step_s": times, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _job(k: int, steps: int, seed0: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--worker", str(k), "--steps", str(steps), "--seed", str(seed0)],
                            stdout=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen) -> dict:
    out, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"worker failed with status {p.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def run(ks: list[int], steps: int) -> None:
    rows = []
    for k in ks:
        t = time.perf_counter()
        packed = _result(_job(k, steps, 0))
        packed_wall = time.perf_counter() - t
        t = time.perf_counter()
        seq = [_result(_job(1, steps, i)) for i in range(k)]
        seq_wall = time.perf_counter() - t
        t = time.perf_counter()
        par = []
        for i in range(0, k, 2):
            jobs = [_job(1, steps, j) for j in range(i, min(i + 2, k))]
            par += [_result(j) for j in jobs]
        par_wall = time.perf_counter() - t
        med = sorted(packed["step_s"])[len(packed["step_s"]) // 2]
        solo_med = sorted(s for r in seq for s in r["step_s"])[len(seq) * steps // 2]
        rows.append((k, packed_wall, seq_wall, par_wall, med / k, solo_med, packed["maxrss_mb"],
                     max(r["maxrss_mb"] for r in seq)))
    print(f"packed cells bench: {steps} update steps per cell, demo shape (P={P} G={G} prompt {PROMPT} + "
          f"completion {COMPLETION} tokens, LoRA r={RANK}); one thread per process")
    print(f"{'K':>2} {'packed s':>9} {'seq s':>7} {'2-at-once s':>11} {'packed/seq':>10} {'packed/2par':>11} "
          f"{'cell step ms packed':>19} {'solo step ms':>12} {'peak MB packed':>14} {'peak MB solo':>12} {'mem ratio':>9}")
    for k, pw, sw, qw, cell_ms, solo_ms, pm, sm in rows:
        print(f"{k:>2} {pw:>9.1f} {sw:>7.1f} {qw:>11.1f} {pw / sw:>10.2f} {pw / qw:>11.2f} {cell_ms * 1e3:>19.1f} "
              f"{solo_ms * 1e3:>12.1f} {pm:>14.0f} {sm:>12.0f} {pm / sm:>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,4,8", help="pack sizes, comma separated")
    ap.add_argument("--steps", type=int, default=20, help="update steps per cell")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps, a.seed)))
        return
    run([int(x) for x in a.ks.split(",")], a.steps)


if __name__ == "__main__":
    main()
