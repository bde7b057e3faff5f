"""Peak memory and time of one update against the rollout batch, with micro-batches (issue 21).

One update of lorarl's trainer (micro-batched loss + backward + AdamW step; lorarl.memory.measure) on a
tiny local-recipe model on the CPU, at rollout batches of 8, 32 and 128 sequences, with
``train.micro_batch_size: 4`` and, beside it in the same run, the whole batch at once (null). Peak =
parameters held + torch.profiler's allocator peak during the update; the memory plan's figure for the same
shape is printed next to it. Ratios are taken within this one run; no wall-clock threshold is asserted.

    python bench/memory.py                       # tiny-arith (LoRA r8), batches 8 32 128, completion 48
    python bench/memory.py --recipe tiny-test --batches 8 32 --completion 32

Expected: with micro-batch 4 the peak stays flat (within 1.3x from 8 to 128) while the whole-batch peak
grows with the batch; the step time grows with the tokens (about linearly).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile

import torch

from lorarl.language.config import CellConfig
from lorarl.memory.arch import VOCAB_LOCAL
from lorarl.memory.measure import generated_batch, measure_update, planned_update, tiny_trainer
from lorarl.models import RECIPES, build_tiny, build_tokenizer

G = 4  # completions per prompt


def build(recipe: str, root: str) -> str:
    """results/models/<recipe>/ at the recipe's shape, random weights, a VOCAB_LOCAL tokenizer (no SFT)."""
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=VOCAB_LOCAL)
    torch.manual_seed(0)
    model = build_tiny(RECIPES[recipe], len(tok), tok.eos_token_id, tok.pad_token_id)
    out = f"{root}/models/{recipe}"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def one(model_dir: str, root: str, recipe: str, batch: int, micro: int | None, completion: int) -> dict:
    cfg = CellConfig.model_validate({"model": f"local:{recipe}", "adapter": {"method": "lora", "rank": 8}, "train": {
        "prompts_per_step": batch // G, "generations": G, "max_completion_length": completion,
        "kl_monitor_every": 0, "beta": 0.0, "micro_batch_size": micro, "gradient_checkpointing": "off"}})
    trainer, ds = tiny_trainer(model_dir, cfg, root)
    b = generated_batch(trainer, ds, G)
    measure_update(trainer, b)  # warm-up: optimiser state created, kernels loaded
    got = measure_update(trainer, b)
    tokens = int(b["completion_ids"].numel() + b["prompt_ids"].numel())
    return {**got, "tokens": tokens, "plan": planned_update(cfg, b, root)["plan_bytes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="tiny-arith", choices=sorted(RECIPES))
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--completion", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root = tempfile.mkdtemp(prefix="lorarl-bench-memory-")
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    model_dir = build(a.recipe, root)
    rows = [(n, m, one(model_dir, root, a.recipe, n, m, a.completion)) for n in a.batches for m in (a.micro, None)]
    print(f"{a.recipe} (LoRA r8, fp32, CPU, {a.threads} thread(s)); completion budget {a.completion}; one update")
    print(f"{'batch':>5} {'micro':>5} {'tokens':>7} {'peak MB':>9} {'plan MB':>9} {'plan/peak':>9} {'update s':>9} "
          f"{'us/token':>9}")
    for n, m, r in rows:
        print(f"{n:>5} {str(m or 'all'):>5} {r['tokens']:>7} {r['peak_bytes'] / 1e6:>9.1f} {r['plan'] / 1e6:>9.1f} "
              f"{r['plan'] / r['peak_bytes']:>9.2f} {r['seconds']:>9.3f} {1e6 * r['seconds'] / r['tokens']:>9.1f}")
    lo, hi = [r for n, m, r in rows if m == a.micro][0], [r for n, m, r in rows if m == a.micro][-1]
    wlo, whi = [r for n, m, r in rows if m is None][0], [r for n, m, r in rows if m is None][-1]
    print(f"\nbatch {a.batches[0]} -> {a.batches[-1]} ({hi['tokens'] / lo['tokens']:.1f}x tokens): "
          f"peak x{hi['peak_bytes'] / lo['peak_bytes']:.2f} with micro-batch {a.micro} "
          f"(whole batch: x{whi['peak_bytes'] / wlo['peak_bytes']:.2f}); update time x{hi['seconds'] / lo['seconds']:.1f}")


if __name__ == "__main__":
    main()
