"""Packed cells vs one process per cell: wall time, per-cell step time, peak memory, side by side.

    python bench/packed.py [--ks 1,2,4,8] [--steps 20]                  # the GRPO update only
    python bench/packed.py --full [--model DIR] [--ks 4,2] [--steps 10] # full jobs: rollouts included

``--full`` compares whole training JOBS, each a fresh process: the pack job (``lorarl.pack.run.train_pack``:
batched rollouts, scoring, reference forward, update, MLflow runs, metrics, adapters) against the solo job
(``lorarl.train.main.train_cell``: the TRL-based trainer, one cell), K cells of the demo shape (LoRA r = 8,
β = 0.05, P = 8 × G = 4, 40 completion tokens, the same seeds), sequential and 2 at a time. ``--model``: a
built base (e.g. results/models/tiny-arith); default: an untrained model of the demo architecture (it never
emits EOS, so every completion is the full 40 tokens: the worst case for both sides).

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
import atexit
import json
import resource
import shutil
import statistics
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
    print(f"packed cells bench: {steps} update steps per cell, demo shape (P={P} G={G} prompt {PROMPT} + "
          f"completion {COMPLETION} tokens, LoRA r={RANK}); one thread per process")
    print(f"{'K':>2} {'packed s':>9} {'seq s':>7} {'2-at-once s':>11} {'packed/seq':>10} {'packed/2par':>11} "
          f"{'cell step ms packed':>19} {'solo step ms':>12} {'peak MB packed':>14} {'peak MB solo':>12} "
          f"{'mem ratio':>9}", flush=True)
    for k in ks:
        t = time.perf_counter()
        packed = _result(_job(k, steps, 0))
        pw = time.perf_counter() - t
        t = time.perf_counter()
        seq = [_result(_job(1, steps, i)) for i in range(k)]
        sw = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(0, k, 2):
            jobs = [_job(1, steps, j) for j in range(i, min(i + 2, k))]
            [_result(j) for j in jobs]
        qw = time.perf_counter() - t
        cell_ms = sorted(packed["step_s"])[len(packed["step_s"]) // 2] / k * 1e3
        solo_ms = sorted(s for r in seq for s in r["step_s"])[len(seq) * steps // 2] * 1e3
        pm, sm = packed["maxrss_mb"], max(r["maxrss_mb"] for r in seq)
        print(f"{k:>2} {pw:>9.1f} {sw:>7.1f} {qw:>11.1f} {pw / sw:>10.2f} {pw / qw:>11.2f} {cell_ms:>19.1f} "
              f"{solo_ms:>12.1f} {pm:>14.0f} {sm:>12.0f} {pm / sm:>9.2f}", flush=True)


def _full_study(wd: Path, model: str, k: int, steps: int) -> Path:
    import yaml

    doc = {"name": "bench", "defaults": {
        "model": model, "task": {"name": "synthetic", "seed": 1234, "n_train": 2000, "n_eval": 8},
        "adapter": {"method": "lora", "rank": RANK, "alpha": 2 * RANK, "dropout": 0.0},
        "train": {"lr": 5e-4, "steps": steps, "prompts_per_step": P, "generations": G, "max_completion_length": COMPLETION,
                  "beta": 0.05, "checkpoint_every": 0}},
        "axes": {"seed": {"field": "seed", "prefix": "s", "values": list(range(k))}}}
    path = wd / f"bench-{k}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def full_worker(kind: str, study_path: str, cells: str, results: str, update_cells: int = 0) -> dict:
    """One job in this process: the pack job over ``cells``, or the solo job of one cell."""
    t0 = time.perf_counter()
    import torch

    from lorarl.language.study import cell_table, load_study

    torch.set_num_threads(1)
    st = load_study(study_path)
    table = cell_table(st)
    ids = cells.split(",")
    if kind == "pack":
        from lorarl.pack.run import train_pack

        train_pack(st.name, [table.cell(c) for c in ids], results, threads=1, pack_id="pack-bench",
                   update_cells=update_cells or None)
    else:
        from lorarl.train.main import train_cell

        train_cell(st.name, table.cell(ids[0]), results, threads=1)
    steps = [json.loads((Path(results) / st.name / c / ".packed" / "summary.json").read_text()) if kind == "pack"
             else json.loads((Path(results) / st.name / c / "summary.json").read_text()) for c in ids]
    return {"wall_s": time.perf_counter() - t0, "step_s": steps[0]["mean_step_time_s"],
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _full_job(kind: str, study: Path, cells: list[str], results: Path, update_cells: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--full-worker", kind, "--study", str(study), "--cells",
                             ",".join(cells), "--results", str(results), "--update-cells", str(update_cells)],
                            stdout=subprocess.PIPE, text=True)


def _demo_model(wd: Path) -> str:
    import torch

    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    d = wd / "model"
    tok = build_tokenizer([f"Q: {a}+{b}=?\nA: {a}+{b}={a + b}\n\\boxed{{{a + b}}}" for a in range(20) for b in range(20)])
    torch.manual_seed(0)
    m = build_tiny(TinyRecipe(), len(tok), tok.eos_token_id, tok.pad_token_id)
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def run_full(ks: list[int], steps: int, model: str | None, update_cells: int = 0) -> None:
    import tempfile

    wd = Path(tempfile.mkdtemp(prefix="packed-bench-"))
    atexit.register(shutil.rmtree, wd, True)  # the temporary folder goes when the bench ends
    model = str(Path(model).resolve()) if model else _demo_model(wd)
    print(f"packed cells bench, FULL jobs: {steps} GRPO steps per cell (rollouts, scoring, KL, update, outputs), "
          f"demo shape (P={P} G={G}, {COMPLETION} completion tokens, LoRA r={RANK}, beta 0.05); model {model}; "
          f"one thread per process; work dir {wd}")
    print(f"{'K':>2} {'packed s':>9} {'seq s':>7} {'2-at-once s':>11} {'packed/seq':>10} {'packed/2par':>11} "
          f"{'cell step ms packed':>19} {'solo step ms':>12} {'peak MB packed':>14} {'peak MB solo':>12} "
          f"{'mem ratio':>9}", flush=True)
    for k in ks:
        study = _full_study(wd, model, k, steps)
        ids = [f"s{i}" for i in range(k)]
        t = time.perf_counter()
        packed = _result(_full_job("pack", study, ids, wd / f"r-pack-{k}", update_cells))
        pw = time.perf_counter() - t
        t = time.perf_counter()
        seq = [_result(_full_job("solo", study, [c], wd / f"r-seq-{k}")) for c in ids]
        sw = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(0, k, 2):
            jobs = [_full_job("solo", study, [c], wd / f"r-par-{k}") for c in ids[i:i + 2]]
            [_result(j) for j in jobs]
        qw = time.perf_counter() - t
        cell_ms, solo_ms = packed["step_s"] / k * 1e3, statistics.median(r["step_s"] for r in seq) * 1e3
        pm, sm = packed["maxrss_mb"], max(r["maxrss_mb"] for r in seq)
        print(f"{k:>2} {pw:>9.1f} {sw:>7.1f} {qw:>11.1f} {pw / sw:>10.2f} {pw / qw:>11.2f} {cell_ms:>19.1f} "
              f"{solo_ms:>12.1f} {pm:>14.0f} {sm:>12.0f} {pm / sm:>9.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,4,8", help="pack sizes, comma separated")
    ap.add_argument("--steps", type=int, default=20, help="update steps per cell")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--full", action="store_true", help="whole training jobs, rollouts included")
    ap.add_argument("--model", default=None, help="--full: a built base model folder")
    ap.add_argument("--update-cells", type=int, default=0, help="--full: pack.update_cells (0 = all at once)")
    ap.add_argument("--full-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--study", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cells", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--results", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.full_worker:
        print(json.dumps(full_worker(a.full_worker, a.study, a.cells, a.results, a.update_cells)))
        return
    if a.full:
        run_full([int(x) for x in a.ks.split(",")], a.steps, a.model, a.update_cells)  # the pack worker's argument
        return
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps, a.seed)))
        return
    run([int(x) for x in a.ks.split(",")], a.steps)


if __name__ == "__main__":
    main()
