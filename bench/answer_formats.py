"""Cost of grading one training batch under each answer format (reward.answer_format), side by side.

Grades the same N completions (long reasoning text ending in both a DAPO ``Answer:`` line and a
``\\boxed{}`` answer, half right) with ``boxed`` (math-verify in lorarl's timed worker pool),
``answer_line`` (DAPO's rule) and ``last_number`` (verl's flexible GSM8K rule), each REPEATS times,
and prints completions per second and the ratio to ``boxed``.  The worker pool is warmed up first
(its start-up is not counted).  Also prints how often the formats agree on these completions.

    python bench/answer_formats.py                  # 1024 completions x 3 repeats
    python bench/answer_formats.py --n 256 --repeats 5
"""

from __future__ import annotations

import argparse
import random
import time

from lorarl.grading.verify import GradingSettings, score_math_batch


def batch(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    golds, comps = [], []
    for i in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        gold = a * b
        said = gold if i % 2 == 0 else gold + rng.randint(1, 9)
        steps = " ".join(f"Step {k}: we have {rng.randint(1, 99)} and {rng.randint(1, 99)}." for k in range(40))
        golds.append(str(gold))
        comps.append(f"{steps}\nSo {a} \\times {b} = \\boxed{{{said}}}.\nAnswer: {said}")
    return golds, comps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    golds, comps = batch(args.n)
    score_math_batch(golds[:8], comps[:8])  # start the worker pool (not timed)
    rate, verdicts = {}, {}
    for fmt in ("boxed", "answer_line", "last_number"):
        settings = GradingSettings(answer_format=fmt)
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            scores = score_math_batch(golds, comps, settings=settings)
        dt = (time.perf_counter() - t0) / args.repeats
        rate[fmt] = args.n / dt
        verdicts[fmt] = [s.correct for s in scores]
    print(f"{args.n} completions, {args.repeats} repeats each")
    for fmt, r in rate.items():
        acc = sum(verdicts[fmt]) / args.n
        agree = sum(x == y for x, y in zip(verdicts[fmt], verdicts["boxed"])) / args.n
        print(f"{fmt:12s} {r:12.0f} completions/s  x{r / rate['boxed']:8.1f} vs boxed  accuracy {acc:.3f}  "
              f"agrees with boxed {agree:.3f}")


if __name__ == "__main__":
    main()
