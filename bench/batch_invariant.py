"""What ``runtime.batch_invariant`` costs a pack, per phase: the same K = 4 mixed-rank pack with the mode off and on,
side by side in one run (rounds alternate off, on, so both see the same load).

    python bench/batch_invariant.py                          # the tests' tiny model (hidden 32, 2 layers), 4 steps
    python bench/batch_invariant.py --hidden 256 --layers 4 --steps 6 --rounds 3

Members: LoRA ranks 2, 8, 16 and 32 (alpha 2r), seeds 0-3, beta 0.05 (a reference forward every step), P = 2 x G = 2
completions of 8 tokens; rewards a deterministic score of the text (an untrained tiny model is never right). The
mode runs every rollout, forward and backward one member at a time (lorarl.numerics.invariant); the phases are the
cost ledger's (lorarl.ledger: generation, reward, reference, update), seconds per step summed over the steps after a
warm-up round that is not counted. Also printed: the largest |difference| of the members' adapters between the two
modes (on a CPU whose kernels do not depend on the batch's shape: 0). One torch thread; this machine's device.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("generation", "reward", "reference", "update")
RANKS = (2, 8, 16, 32)


def cells(model: str, on: bool, steps: int) -> list:
    from types import SimpleNamespace

    from lorarl.language.config import CellConfig

    out = []
    for k, r in enumerate(RANKS):
        cfg = CellConfig(model=model, seed=k, task={"name": "synthetic", "seed": 7, "n_train": 24, "n_eval": 4,
                                                    "max_value": 9},
                         adapter={"method": "lora", "rank": r, "alpha": 2 * r, "dropout": 0.0},
                         train={"prompts_per_step": 2, "generations": 2, "max_completion_length": 8, "lr": 1e-2,
                                "steps": steps, "beta": 0.05, "kl_monitor_every": 0, "checkpoint_every": 0},
                         runtime={"batch_invariant": on})
        out.append(SimpleNamespace(id=f"r{r}", config=cfg))
    return out


def run(model: str, on: bool, steps: int, results: Path, device: str) -> tuple[dict, dict]:
    """One pack of the four members for ``steps`` steps: seconds per phase and the trained adapters."""
    from lorarl import ledger
    from lorarl.pack.build import build_pack
    from lorarl.rewards.outcome import OutcomeDeposits

    import resident_packs as rb

    pack = build_pack(cells(model, on, steps), results_dir=results, device=device)
    for m in pack.loop.members:
        m.regime = OutcomeDeposits(score_fn=rb.text_score)
    ledger.begin(in_process=True)
    t0 = time.perf_counter()
    for _ in range(steps):
        pack.loop.step()
    got = {p: ledger.total(p) for p in PHASES}
    got["step"] = time.perf_counter() - t0
    weights = {(c.name, n): p.detach().cpu().clone() for c in pack.loop.trainer.cells
               for n, p in c.model.named_parameters() if p.requires_grad}
    return got, weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=32, help="model width")
    ap.add_argument("--layers", type=int, default=2, help="model depth")
    ap.add_argument("--steps", type=int, default=4, help="steps of each pack")
    ap.add_argument("--rounds", type=int, default=3, help="off/on rounds counted (after one warm-up round)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    import resident_packs as rb

    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU, 1 thread"
    root = Path(tempfile.mkdtemp(prefix="batch-invariant-"))
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    model = rb.save_tiny(root / "tiny", args.hidden, args.layers)
    total = {m: {p: 0.0 for p in (*PHASES, "step")} for m in ("off", "on")}
    gap = 0.0
    for rnd in range(args.rounds + 1):
        got = {}
        for mode in ("off", "on"):
            got[mode] = run(model, mode == "on", args.steps, root / f"{mode}{rnd}", device)
        gap = max(gap, max(float((got["off"][1][k] - got["on"][1][k]).abs().max()) for k in got["off"][1]))
        if rnd:  # round 0 warms up (imports, first kernels)
            for mode in ("off", "on"):
                for p, s in got[mode][0].items():
                    total[mode][p] += s
    n = args.rounds * args.steps
    print(f"K = {len(RANKS)} members (LoRA ranks {', '.join(map(str, RANKS))}), hidden {args.hidden}, "
          f"{args.layers} layers, {args.rounds} rounds x {args.steps} steps per mode, {name}")
    print(f"{'phase':<11} {'off s/step':>11} {'on s/step':>11} {'on / off':>9}")
    for p in (*PHASES, "step"):
        off, on = total["off"][p] / n, total["on"][p] / n
        print(f"{p:<11} {off:>11.4f} {on:>11.4f} {on / off if off else float('nan'):>8.2f}x")
    print(f"largest |adapter difference| off vs on: {gap:.3g}")


if __name__ == "__main__":
    main()
