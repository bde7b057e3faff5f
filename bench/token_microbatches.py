"""Padding and update time on a length-skewed batch: micro-batches by rows against a token budget (issue 49).

One update of lorarl's trainer (the chunked loss + backward + AdamW step; lorarl.memory.measure) on a tiny
local-recipe model (LoRA r8, fp32, CPU) and an RLVR-shaped batch: a few completions at the length limit among
short ones. Beside each other in one run: ``train.micro_batch_size: m`` (chunks of m rows, each padded to the
batch's width) and ``train.micro_batch_tokens: m x width`` (the same bound on a forward's positions; rows sorted
by length, each chunk trimmed to its longest row; lorarl.train.tokenbudget). Printed: the padding positions the
forwards compute, the median update time of a few repeats, the allocator peak, and the ratios rows / tokens.
No wall-clock threshold is asserted.

    python bench/token_microbatches.py                    # 16 rows, 2 of 256 tokens, the rest 8..64; micro 4
    python bench/token_microbatches.py --rows 32 --long 4 --limit 512 --repeats 3

Expected: several times fewer padding positions with the token budget and an update time that falls with
them (the forwards of the rows mode spend most of their positions on padding).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import statistics
import tempfile

import torch

from lorarl.language.config import CellConfig
from lorarl.memory.arch import VOCAB_LOCAL
from lorarl.memory.measure import measure_update, tiny_trainer
from lorarl.models import RECIPES, build_tiny, build_tokenizer
from lorarl.train.tokenbudget import padded_tokens, plan_chunks, row_lengths

G = 4  # completions per prompt
PROMPT = 24  # prompt tokens (left-padded from 16..24)


def build(recipe: str, root: str) -> str:
    """A local-recipe model with random weights and a VOCAB_LOCAL tokenizer (no SFT)."""
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=VOCAB_LOCAL)
    torch.manual_seed(0)
    model = build_tiny(RECIPES[recipe], len(tok), tok.eos_token_id, tok.pad_token_id)
    out = f"{root}/models/{recipe}"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def skewed_batch(rows: int, long: int, limit: int, vocab: int, pad: int) -> dict:
    """``long`` completions of ``limit`` tokens, the rest 8..64 (a seeded draw); prompts 16..24, left-padded."""
    g = torch.Generator().manual_seed(0)
    comp = [limit] * long + torch.randint(8, 65, (rows - long,), generator=g).tolist()
    prm = torch.randint(16, PROMPT + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(PROMPT)[None, :] >= PROMPT - prm[:, None]).long()
    comp_mask = (torch.arange(limit)[None, :] < torch.tensor(comp)[:, None]).long()
    ids = lambda shape: torch.randint(3, vocab, shape, generator=g)  # noqa: E731
    return {"prompt_ids": torch.where(prompt_mask.bool(), ids((rows, PROMPT)), pad), "prompt_mask": prompt_mask,
            "completion_ids": torch.where(comp_mask.bool(), ids((rows, limit)), pad), "completion_mask": comp_mask,
            "advantages": torch.randn(rows, limit, generator=g) * comp_mask,
            "num_items_in_batch": comp_mask.sum().float()}


def padding(batch: dict, micro: int | None, budget: int | None) -> int:
    """Padding positions the update's forwards compute: rows x width per chunk, less the real tokens."""
    real = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
    B, width = batch["completion_ids"].size(0), batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    if budget is None:
        return B * width - real  # row chunks: every chunk at the batch's width
    lengths = row_lengths(batch)
    chunks = plan_chunks(lengths, budget)
    return padded_tokens(chunks, [lengths[c[0]] for c in chunks], real)


def one(model_dir: str, root: str, recipe: str, batch: dict, micro: int | None, budget: int | None,
        repeats: int) -> dict:
    rows, limit = batch["completion_ids"].shape
    cfg = CellConfig.model_validate({"model": f"local:{recipe}", "adapter": {"method": "lora", "rank": 8}, "train": {
        "prompts_per_step": rows // G, "generations": G, "max_completion_length": limit, "kl_monitor_every": 0,
        "beta": 0.0, "micro_batch_size": micro, "micro_batch_tokens": budget, "gradient_checkpointing": "off"}})
    trainer, _ = tiny_trainer(model_dir, cfg, root)
    trainer.model.train()
    measure_update(trainer, batch)  # warm-up: optimiser state created, kernels loaded
    runs = [measure_update(trainer, batch) for _ in range(repeats)]
    return {"seconds": statistics.median(r["seconds"] for r in runs), "peak": max(r["peak_bytes"] for r in runs),
            "padding": padding(batch, micro, budget)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="tiny-arith", choices=sorted(RECIPES))
    ap.add_argument("--rows", type=int, default=16, help="sequences of the update (a multiple of 4)")
    ap.add_argument("--long", type=int, default=2, help="completions at the length limit")
    ap.add_argument("--limit", type=int, default=256, help="max_completion_length")
    ap.add_argument("--micro", type=int, default=4, help="rows per forward of the rows mode")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root = tempfile.mkdtemp(prefix="lorarl-bench-tokens-")
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    model_dir = build(a.recipe, root)
    from lorarl.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(model_dir)
    batch = skewed_batch(a.rows, a.long, a.limit, len(tok), tok.pad_token_id)
    budget = a.micro * (PROMPT + a.limit)  # the rows mode's bound on a forward's positions
    real = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
    rows = one(model_dir, root, a.recipe, batch, a.micro, None, a.repeats)
    toks = one(model_dir, root, a.recipe, batch, None, budget, a.repeats)
    print(f"{a.recipe} (LoRA r8, fp32, CPU, {a.threads} thread(s)); {a.rows} rows: {a.long} completions of "
          f"{a.limit} tokens, the rest 8..64; {real} real tokens; one update, median of {a.repeats}")
    print(f"{'mode':>22} {'padding':>9} {'update s':>9} {'peak MB':>9}")
    for name, r in ((f"micro_batch_size {a.micro}", rows), (f"micro_batch_tokens {budget}", toks)):
        print(f"{name:>22} {r['padding']:>9} {r['seconds']:>9.3f} {r['peak'] / 1e6:>9.1f}")
    print(f"\nrows / tokens: padding x{rows['padding'] / max(toks['padding'], 1):.1f}, "
          f"update time x{rows['seconds'] / toks['seconds']:.2f}, peak x{rows['peak'] / toks['peak']:.2f}")


if __name__ == "__main__":
    main()
