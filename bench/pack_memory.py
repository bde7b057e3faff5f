"""Peak memory and time of one PACKED update against the rollout batch, with micro-batches and activation
checkpointing of the shared base (issue 21, lorarl.pack.trainer).

K LoRA cells (r8) on one tiny local-recipe base, random weights, on the CPU in fp32: one optimiser step of
every cell (routed forward, loss with a k3 KL term, backward, AdamW) at rollout batches of 8, 32 and 128
sequences per cell, with ``train.micro_batch_size: 4``, the whole batch (null), micro-batch 4 with the
shared base checkpointed, and the whole batch with full-sequence vocabulary logits (lorarl.pack.tiled off),
side by side in one run. Peak = torch.profiler's allocator peak during the
update (lorarl.memory.measure.allocated_peak; the weights held before it are not counted). Ratios are
taken within this one run; nothing asserts a wall-clock figure.

    python bench/pack_memory.py                          # tiny-arith, 2 cells, batches 8 32 128
    python bench/pack_memory.py --cells 4 --batches 8 32 --completion 32
    python bench/pack_memory.py --vocab 32768 --batches 8 32 128   # a real vocabulary: logits dominate

Expected: with micro-batch 4 the peak stays about flat from 8 to 128 sequences per cell while the
whole-batch peak grows with the batch; checkpointing lowers the micro-batched peak further; the update
time grows about linearly with the tokens.
"""

from __future__ import annotations

import argparse
import time

import torch

from lorarl.memory.arch import VOCAB_LOCAL
from lorarl.memory.measure import allocated_peak
from lorarl.models import RECIPES, build_tiny
from lorarl.pack.tiled import LOGIT_TOKENS

PROMPT = 16  # prompt columns


def cells(recipe: str, k: int, vocab: int) -> list:
    from peft import LoraConfig, get_peft_model

    from lorarl.pack.loss import LossSettings
    from lorarl.pack.trainer import PackCell

    out = []
    for s in range(k):
        torch.manual_seed(0)  # one base: every cell's frozen weights equal bit for bit (the router checks)
        base = build_tiny(RECIPES[recipe], vocab, 1, 0)
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                                task_type="CAUSAL_LM"))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        out.append(PackCell(f"c{s}", model, opt, LossSettings(beta=0.04, max_completion_length=64),
                            max_grad_norm=1.0))
    return out


def batch(n: int, completion: int, seed: int, vocab: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask_BT = (torch.arange(completion)[None] < torch.randint(completion // 2, completion + 1, (n, 1), generator=g))
    return {"prompt_ids": torch.randint(2, vocab, (n, PROMPT), generator=g),
            "prompt_mask": torch.ones(n, PROMPT, dtype=torch.long),
            "completion_ids": torch.randint(2, vocab, (n, completion), generator=g),
            "completion_mask": mask_BT.long(), "advantages": torch.randn(n, 1, generator=g).expand(n, completion),
            "lorarl_ref_logps": -torch.rand(n, completion, generator=g) * 5}


def one(trainer, n: int, completion: int, micro: int | None, ckpt: bool, tiles: bool) -> dict:
    base = trainer.host.get_base_model()
    if ckpt:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_disable()
    trainer.micro_batch_size = micro
    trainer.logit_tokens = LOGIT_TOKENS if tiles else 10 ** 12  # off: full-sequence logits
    bs = [batch(n, completion, 10 * n + k, trainer.vocab) for k in range(len(trainer.cells))]
    trainer.step(bs)  # warm-up: AdamW state created

    def update() -> float:
        t0 = time.perf_counter()
        trainer.step(bs)
        return time.perf_counter() - t0

    peak, seconds = allocated_peak(update)
    return {"peak": peak, "seconds": seconds, "tokens": len(bs) * n * (PROMPT + completion)}


def main() -> None:
    from lorarl.pack.trainer import PackedTrainer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="tiny-arith", choices=sorted(RECIPES))
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--completion", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=VOCAB_LOCAL, help="vocabulary size (logits grow with it)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    trainer = PackedTrainer(cells(a.recipe, a.cells, a.vocab), fused_lm_head=False)
    trainer.vocab = a.vocab
    modes = [(a.micro, False, True), (None, False, True), (a.micro, True, True), (None, False, False)]
    rows = [(n, m, c, t, one(trainer, n, a.completion, m, c, t)) for n in a.batches for m, c, t in modes]
    print(f"{a.recipe}, vocabulary {a.vocab}, {a.cells} LoRA r8 cells packed (fp32, CPU, {a.threads} thread(s)); "
          f"completion {a.completion}; "
          "one packed update")
    print(f"{'rows/cell':>9} {'micro':>5} {'ckpt':>5} {'tiles':>5} {'tokens':>7} {'peak MB':>9} {'update s':>9} "
          f"{'us/token':>9}")
    for n, m, c, t, r in rows:
        print(f"{n:>9} {str(m or 'all'):>5} {'on' if c else 'off':>5} {'on' if t else 'off':>5} {r['tokens']:>7} "
              f"{r['peak'] / 1e6:>9.1f} {r['seconds']:>9.3f} {1e6 * r['seconds'] / r['tokens']:>9.1f}")
    for mode in modes:
        sel = [r for n, m, c, t, r in rows if (m, c, t) == mode]
        lo, hi = sel[0], sel[-1]
        print(f"micro {mode[0] or 'all'}, checkpointing {'on' if mode[1] else 'off'}, logit tiles "
              f"{'on' if mode[2] else 'off'}: batch {a.batches[0]} -> {a.batches[-1]}: "
              f"peak x{hi['peak'] / lo['peak']:.2f}, update time x{hi['seconds'] / lo['seconds']:.1f}")
    big = {(m, c, t): r for n, m, c, t, r in rows if n == a.batches[-1]}
    ref = big[(None, False, False)]
    print(f"at {a.batches[-1]} rows/cell, against the whole batch with full-sequence logits: "
          + ", ".join(f"{'micro ' + str(m) if m else 'whole batch'}{' checkpointed' if c else ''}"
                      f"{' tiled' if t else ''} peak x{big[(m, c, t)]['peak'] / ref['peak']:.2f}"
                      for m, c, t in modes[:3]))


if __name__ == "__main__":
    main()
