"""Peak memory and time of one HF-engine rollout against ``rollout.generation_batch_size`` (issue 21 item 4).

lorarl's solo trainer (``LorarlGRPOTrainer._generate_single_turn``: chunked generation, per-row uniforms,
lorarl.train.rowsample) on a tiny local-recipe model on the CPU generates one rollout batch whole (null) and
in chunks, side by side in one run; then TRL's stock HF path (one ``generate`` over the batch, HF's own
multinomial) on the same batch for the sampler's overhead. Peak = torch.profiler's allocator peak during
the rollout (lorarl.memory.measure.allocated_peak): the KV cache and the logits of the rows generated at
once. Every chunking must give the same completions (checked, not timed). No wall-clock threshold.

    python bench/rollout_chunks.py                          # tiny-arith, 64 rows, 64 new tokens, chunks 16 4
    python bench/rollout_chunks.py --recipe tiny-test --rows 32 --chunks 8 --tokens 32

Expected: the peak falls with the chunk (KV cache of the chunk, not of the batch); the time grows as the
chunk shrinks (fewer rows per forward); lorarl's sampler costs about what HF's multinomial costs.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from lorarl.language.config import CellConfig
from lorarl.memory.measure import allocated_peak, tiny_trainer
from lorarl.train.rowsample import ChunkedRollouts

G = 4  # completions per prompt


def main() -> None:
    from bench.memory import build

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="tiny-arith")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per row")
    ap.add_argument("--chunks", type=int, nargs="+", default=[16, 4])
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        model_dir = build(a.recipe, root)
        cfg = CellConfig.model_validate({"model": f"local:{a.recipe}", "adapter": {"method": "lora", "rank": 8},
                                         "train": {"prompts_per_step": a.rows // G, "generations": G,
                                                   "max_completion_length": a.tokens, "kl_monitor_every": 0}})
        trainer, _ = tiny_trainer(model_dir, cfg, root)
        tok = trainer.processing_class
        prompts = [tok(f"Q: {10 + i}+{20 + 3 * i}=?\nA: ")["input_ids"] for i in range(a.rows)]
        trainer.model.train()

        def rollout(chunk, stock=False):
            trainer.generation_batch_size = chunk
            torch.manual_seed(0)
            t0 = time.perf_counter()
            if stock:  # TRL's own HF path (the method this project overrides)
                ids, _ = super(ChunkedRollouts, trainer)._generate_single_turn(prompts, None, {}, G)
            else:
                ids, _ = trainer._generate_single_turn(prompts, None, {}, G)
            return ids, time.perf_counter() - t0

        def measured(chunk, stock=False):
            """(peak bytes under the profiler, completions, best seconds of three unprofiled runs)."""
            peak, (ids, _) = allocated_peak(lambda: rollout(chunk, stock))
            return peak, ids, min(rollout(chunk, stock)[1] for _ in range(3))

        rollout(None)  # warm-up
        ref_peak, ref, ref_s = measured(None)
        print(f"{a.recipe}: {a.rows} rows x {a.tokens} new tokens, CPU 1 thread "
              f"(mean completion {sum(map(len, ref)) / len(ref):.1f} tokens)")
        print(f"{'chunk':>8} {'peak MiB':>9} {'peak/whole':>10} {'seconds':>8} {'time/whole':>10} same samples")
        print(f"{'null':>8} {ref_peak / 2**20:9.1f} {1.0:10.2f} {ref_s:8.2f} {1.0:10.2f} yes")
        for chunk in a.chunks:
            peak, ids, s = measured(chunk)
            print(f"{chunk:>8} {peak / 2**20:9.1f} {peak / ref_peak:10.2f} {s:8.2f} {s / ref_s:10.2f} "
                  f"{'yes' if ids == ref else 'NO'}")
        peak, ids, s = measured(None, stock=True)
        print(f"{'TRL':>8} {peak / 2**20:9.1f} {peak / ref_peak:10.2f} {s:8.2f} {s / ref_s:10.2f} "
              f"(stock HF multinomial, whole batch: other samples, mean {sum(map(len, ids)) / len(ids):.1f} tokens)")

if __name__ == "__main__":
    main()
