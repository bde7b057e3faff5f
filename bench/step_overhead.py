"""Per-step overhead of lorarl's trainer vs a bare TRL GRPOTrainer script, same cell, interleaved.

    python bench/step_overhead.py [--steps 40] [--repeats 2] [--study experiments/demo.yaml] [--cell r8-kl0-s0]

Both sides train the same cell config (same model, LoRA, GRPOConfig, data, seed). The bare side is
what a researcher would write by hand: GRPOTrainer + a math-verify reward, no tracking. Runs are
interleaved A B A B … in one process so machine load hits both alike; the printed figure is the
ratio of median step times (lorarl / bare TRL). Needs the base model built (`snakemake all` or
`lorarl launch base - tiny-arith`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self._t)


def bare_trl(cell, results: str, workdir: Path) -> list[float]:
    """The hand-written baseline: GRPOTrainer + math-verify reward, nothing else."""
    import datasets
    from math_verify import parse, verify
    from trl import GRPOTrainer

    from lorarl.tasks import task_records
    from peft import LoraConfig

    from lorarl.train.prepare import load_policy
    from lorarl.train.trl_args import grpo_args

    def reward(prompts, completions, answer, **kw):
        out = []
        for c, a in zip(completions, answer):
            try:
                out.append(float(verify(parse(f"\\boxed{{{a}}}"), parse(c))))
            except Exception:
                out.append(0.0)
        return out

    cfg = cell.config
    a = cfg.adapter
    lora = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout, target_modules=a.target_modules,
                      task_type="CAUSAL_LM")
    model, tok = load_policy(cfg, results, "cpu")
    rows, _ = task_records(cfg.task)
    ds = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=grpo_args(cfg, workdir / "bare", True),
                          train_dataset=ds, processing_class=tok, peft_config=lora, callbacks=[timer])
    trainer.train()
    return timer.times


def lorarl_side(study_name: str, cell, results: str) -> list[float]:
    import pandas as pd

    from lorarl import paths
    from lorarl.train.main import train_cell

    train_cell(study_name, cell, results)
    df = pd.read_csv(paths.path("metrics", results=results, study=study_name, cell=cell.id))
    return df["step_time_s"].tolist()


def main() -> None:
    import torch

    from lorarl.language.study import cell_table, load_study

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="experiments/demo.yaml")
    ap.add_argument("--cell", default="r8-kl0-s0")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--results", default="results")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    study = load_study(a.study)
    cell = cell_table(study).cell(a.cell)
    cell = type(cell)(cell.id, cell.axes, cell.config.model_copy(
        update={"train": cell.config.train.model_copy(update={"steps": a.steps})}), cell.hash)
    ours, bare = [], []
    with tempfile.TemporaryDirectory() as tmp:
        bench_results = Path(tmp) / "results"
        (bench_results / "models").mkdir(parents=True)
        (bench_results / "models" / "tiny-arith").symlink_to(Path(a.results, "models", "tiny-arith").resolve())
        for i in range(a.repeats):
            ours += lorarl_side("bench", cell, str(bench_results))[1:]  # first step warms caches
            bare += bare_trl(cell, str(bench_results), Path(tmp))[1:]
            print(f"repeat {i + 1}: lorarl median {statistics.median(ours):.4f}s  bare TRL median "
                  f"{statistics.median(bare):.4f}s", flush=True)
    ratio = statistics.median(ours) / statistics.median(bare)
    print(f"\ncell {a.cell}, {a.steps} steps x {a.repeats} interleaved repeats, {a.threads} thread(s)")
    print(f"median step time: lorarl {statistics.median(ours):.4f}s, bare TRL {statistics.median(bare):.4f}s")
    print(f"ratio lorarl / bare TRL = {ratio:.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
