"""Cost of deterministic grading: one math-verify comparison with and without the per-comparison
state reset (cleared sympy / math-verify caches, re-seeded assumption RNG), measured side by side
in one process, in alternating rounds over pairs of the same shapes (numbers never repeat).

    python bench/grading_reset.py                 # 5 rounds of 40 pairs per arm
    python bench/grading_reset.py --rounds 10

Prints the mean milliseconds per comparison of both and the ratio reset / no reset (CPU time of this
process, steadier than wall time on a loaded machine).  The "no reset" arm is the old behaviour:
warm caches shared across comparisons (and history-dependent verdicts).
"""

from __future__ import annotations

import argparse
import logging
import time

SHAPES = [  # every comparison gets fresh numbers, so no arm is helped by repeated text
    lambda k: (f"{k}", rf"\boxed{{{k}}}"),
    lambda k: (rf"\frac{{1}}{{{k}}}", rf"\boxed{{1/{k}}}"),
    lambda k: (f"{k},{k + 1}", rf"\boxed{{{k}}} and \boxed{{{k + 1}}}"),
    lambda k: (f"{k}000", rf"\boxed{{{k}\,000}}"),
    lambda k: (f"x={k}", rf"\boxed{{{k}}}"),
    lambda k: (f"(x+{k})^2", rf"\boxed{{x^2+{2 * k}x+{k * k}}}"),
    lambda k: (rf"\sqrt{{{k}}}", rf"\boxed{{{k}^{{1/2}}}}"),
    lambda k: (f"({k},{k + 2})", rf"\boxed{{({k}, {k + 2})}}"),
]


def pairs(offset: int, n: int) -> list[tuple[str, str]]:
    return [SHAPES[i % len(SHAPES)](offset + i + 2) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from lorarl.grading import verify as grading
    from lorarl.grading.answers import prepare_completion

    reset = grading._fresh_state
    for g, c in pairs(10 ** 6, 16):             # imports and first-use costs out of the way
        grading._math_task(g, prepare_completion(c), 30.0)
    times = {"reset": 0.0, "no reset": 0.0}
    right = {"reset": 0, "no reset": 0}
    n_pairs = 40
    for r in range(args.rounds):
        for j, arm in enumerate(("reset", "no reset")):
            grading._fresh_state = reset if arm == "reset" else (lambda: None)
            tasks = [(g, prepare_completion(c)) for g, c in pairs((2 * r + j) * n_pairs, n_pairs)]
            t0 = time.process_time()
            right[arm] += sum(grading._math_task(g, c, 30.0)[0] for g, c in tasks)
            times[arm] += time.process_time() - t0
    grading._fresh_state = reset
    n = args.rounds * n_pairs
    for arm, t in times.items():
        print(f"{arm:>9}: {1e3 * t / n:7.2f} ms per comparison (CPU)")
    print(f"ratio reset / no reset: {times['reset'] / times['no reset']:.2f}x "
          f"({n} distinct comparisons per arm; graded correct: {right['reset']} / {right['no reset']})")


if __name__ == "__main__":
    main()
