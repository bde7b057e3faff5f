"""Savings of an adaptive study's `search:` on real recorded grids, with Optuna's successive halving as the peer
(issue 40, item 5b).

    python bench/adaptive_savings.py [--replays 1000] [--seed 0] [--grids demo,wide] [--no-optuna]

The grids are two CPU studies run to the end as full grids (every cell to its last step, held-out snapshots
every 10 steps) by bench/adaptive_grids.py, which records per cell, at every snapshot and the last step, which
of the 200 held-out problems it solved (greedy pass@1): bench/results/adaptive_grids/<grid>.json (committed).
Per grid, the `search:` block fixed before the grids ran (the defaults: rungs ``eval_every x eta^k`` below
``train.steps``, paired by seed) is replayed with lorarl's own decision function (lorarl.adaptive.halving.decide)
on the recorded rung values, then on ``--replays`` bootstrap replays: the seeds (the same draw for every
setting: paired) and the problems (the same draw for every cell and step) resampled with replacement, each
cell's rung value recomputed from its resampled problems.

* **cell-steps saved**: 1 - (steps the search lets the cells train: a stopped setting's cells to its rung, a
  kept setting's to the end) / (cells x steps of the full grid);
* **right answer**: a setting the search keeps to the end has a full-grid final metric (the recorded grid's
  mean over seeds at the last step) within the study's MDE of the grid's best; the study's MDE is the median,
  over the other settings, of the minimum detectable effect of their difference to the grid's best setting
  (2.80 x the bootstrap sd of the difference over seeds and problems: a fixed yardstick of this benchmark; the
  stats table's own MDE is lorarl.report.stats' two-level one, wider at few seeds).
  Where settings differ by less than that, any of them is a right answer. Also printed: how many settings lie
  farther than the MDE from the best (the only wrong answers), and the mean **regret** over the replays (the
  grid's best final metric minus that of the best setting kept).

The peer: Optuna's ``SuccessiveHalvingPruner`` (same ``min_resource`` = the first rung, same ``reduction_factor``
= eta, so the same rungs) replayed on the same stored values: every cell one trial (Optuna knows no pairing),
the trials one after another in a random arrival order (a fresh order per replay), each reporting its value at
every snapshot step and stopped as soon as ``should_prune()`` says so; its answer is the setting of its best
completed trial. Optuna is optional (``pip install optuna``, or ``.[bench]``); without it the peer is skipped.
The numbers count cell-steps and decisions: the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "results" / "adaptive_grids"
SEARCH = {"demo": {"rule": "sha", "eta": 2}, "wide": {"rule": "sha", "eta": 3}}  # the blocks, fixed beforehand
Z_MDE = 1.959964 + 0.841621  # z_0.975 + z_0.80, as lorarl.report.stats


class Grid:
    """A recorded grid: settings (non-seed labels) x seeds x steps x problems of 0/1."""

    def __init__(self, doc: dict):
        study = doc["study"]
        self.name, self.seed_axis = doc["grid"], doc["seed_axis"]
        self.steps = int(study["defaults"]["train"]["steps"])
        self.every = int(study["defaults"]["eval"]["eval_every"])
        self.snaps = list(range(self.every, self.steps, self.every)) + [self.steps]
        axes = [a for a in doc.get("axes", study["axes"]) if a != self.seed_axis]  # the study's axis order
        self.seeds = sorted({c["axes"][self.seed_axis] for c in doc["cells"].values()}, key=str)
        self.settings = list(dict.fromkeys(",".join(f"{a}={c['axes'][a]}" for a in axes) or "all"
                                           for c in doc["cells"].values()))
        shape = (len(self.settings), len(self.seeds), len(self.snaps), doc["problems"])
        self.solved = np.zeros(shape, dtype=np.float64)  # [setting, seed, step, problem]
        for c in doc["cells"].values():
            i = self.settings.index(",".join(f"{a}={c['axes'][a]}" for a in axes) or "all")
            j = self.seeds.index(c["axes"][self.seed_axis])
            for k, st in enumerate(self.snaps):
                self.solved[i, j, k] = [ch == "1" for ch in c["solved"][str(st)]]

    def values(self, seeds: np.ndarray | None = None, problems: np.ndarray | None = None) -> np.ndarray:
        """[setting, seed draw, step]: each cell's pass@1 over the (drawn) problems."""
        x = self.solved if seeds is None else self.solved[:, seeds]
        return (x if problems is None else x[..., problems]).mean(axis=-1)


def rungs_of(grid: Grid, eta: int) -> list[int]:
    out, r = [], grid.every
    while r < grid.steps:
        out.append(r)
        r *= eta
    return out


def study_mde(grid: Grid, rng: np.random.Generator, n_boot: int = 2000) -> tuple[int, float]:
    """(the grid's best setting, the median MDE of the others' difference to it), seeds x problems bootstrap."""
    final = grid.values()[:, :, -1]  # [setting, seed]
    best = int(np.argmax(final.mean(axis=1)))
    S, P = len(grid.seeds), grid.solved.shape[-1]
    seeds, probs = rng.integers(0, S, (n_boot, S)), rng.integers(0, P, (n_boot, P))
    x = grid.solved[:, :, -1]  # [setting, seed, problem]
    boot = np.stack([x[:, seeds[b]][:, :, probs[b]].mean(axis=(1, 2)) for b in range(n_boot)])  # [B, setting]
    mdes = [Z_MDE * np.std(boot[:, best] - boot[:, s], ddof=1) for s in range(len(grid.settings)) if s != best]
    return best, float(np.median(mdes))


def replay_search(grid: Grid, vals: np.ndarray, rule: str, eta: int) -> tuple[list[int], int]:
    """lorarl's decide() on one set of values [setting, seed draw, step]: (kept settings, cell-steps)."""
    from types import SimpleNamespace

    from lorarl.adaptive.halving import decide
    from lorarl.language.adaptive.settings import Setting

    rungs = rungs_of(grid, eta)
    n_seeds = vals.shape[1]
    settings = [Setting(name, (), tuple(f"{i}#{j}" for j in range(n_seeds)), ()) for i, name in enumerate(grid.settings)]
    records = {"values": {f"{i}#{j}": {str(r): float(vals[i, j, grid.snaps.index(r)]) for r in rungs}
                          for i in range(len(grid.settings)) for j in range(n_seeds)}, "failed": {}}
    spec = SimpleNamespace(model_dump=lambda mode=None: {"rule": rule, "rungs": rungs, "eta": eta, "min_kept": 1,
                                                         "direction": "max", "metric": "synthetic/pass@1"})
    led = decide(spec, settings, records)
    kept, spent = [], 0
    for i, name in enumerate(grid.settings):
        st = led["state"][name]
        if st["state"] == "finishing":
            kept.append(i)
            spent += n_seeds * grid.steps
        else:
            spent += n_seeds * st["rung"]
    return kept, spent


def replay_optuna(grid: Grid, vals: np.ndarray, eta: int, rng: np.random.Generator) -> tuple[list[int], int]:
    """Optuna's SuccessiveHalvingPruner on the same values: (the best completed trial's setting, cell-steps)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rungs = rungs_of(grid, eta)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=rungs[0], reduction_factor=eta))
    trials = [(i, j) for i in range(vals.shape[0]) for j in range(vals.shape[1])]
    spent = 0
    for t in rng.permutation(len(trials)):
        i, j = trials[t]
        trial = study.ask()
        trial.set_user_attr("setting", i)
        for k, step in enumerate(grid.snaps):
            trial.report(float(vals[i, j, k]), step)
            if step < grid.steps and trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                spent += step
                break
        else:
            study.tell(trial, float(vals[i, j, -1]))
            spent += grid.steps
    return [study.best_trial.user_attrs["setting"]], spent


def bench(grid: Grid, replays: int, seed: int, peer: bool) -> list[dict]:
    rng = np.random.default_rng(seed)
    best, mde = study_mde(grid, rng)
    final = grid.values()[:, :, -1].mean(axis=1)
    full = len(grid.settings) * len(grid.seeds) * grid.steps
    sp = SEARCH[grid.name]
    methods = [("lorarl search " + rule, rule) for rule in ("sha", "asha")] + ([("Optuna SuccessiveHalvingPruner",
                                                                                  "optuna")] if peer else [])
    out = []
    for label, how in methods:
        def run(vals, r):
            return replay_optuna(grid, vals, sp["eta"], r) if how == "optuna" else replay_search(grid, vals, how, sp["eta"])

        t0 = time.time()
        kept, spent = run(grid.values(), np.random.default_rng(seed))
        ok0 = any(final[k] >= final[best] - mde for k in kept)
        oks, saves, gaps = [], [], []
        draws = np.random.default_rng(seed + 1)
        order = np.random.default_rng(seed + 2)
        for _ in range(replays):
            seeds = draws.integers(0, len(grid.seeds), len(grid.seeds))
            probs = draws.integers(0, grid.solved.shape[-1], grid.solved.shape[-1])
            k, s = run(grid.values(seeds, probs), order)
            oks.append(any(final[x] >= final[best] - mde for x in k))
            saves.append(1 - s / full)
            gaps.append(final[best] - max(final[x] for x in k))
        out.append({"grid": grid.name, "method": label, "rungs": rungs_of(grid, sp["eta"]), "eta": sp["eta"],
                    "cells": len(grid.settings) * len(grid.seeds), "full": full, "spent": spent,
                    "saved": 1 - spent / full, "kept": [grid.settings[k] for k in kept], "right": ok0,
                    "right_rate": float(np.mean(oks)), "saved_mean": float(np.mean(saves)),
                    "regret": float(np.mean(gaps)), "wrong_settings": int(sum(final < final[best] - mde)),
                    "best": grid.settings[best], "best_value": float(final[best]), "mde": mde,
                    "seconds": round(time.time() - t0, 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replays", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grids", default="demo,wide")
    ap.add_argument("--no-optuna", action="store_true", help="skip the peer")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    peer = not args.no_optuna
    if peer:
        try:
            import optuna  # noqa: F401
        except ImportError:
            print("optuna is not installed (pip install optuna): the peer is skipped", file=sys.stderr)
            peer = False
    print("| grid | cells x steps | method | rungs (eta) | cell-steps (full grid) | saved | kept | right answer "
          f"| right in {args.replays} bootstrap replays | mean saved in replays | mean regret in replays |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.grids.split(","):
        grid = Grid(json.loads((DATA / f"{name}.json").read_text()))
        for r in bench(grid, args.replays, args.seed, peer):
            print(f"| {name} (best {r['best']} {r['best_value']:.3f}, MDE {r['mde']:.3f}, {r['wrong_settings']} of "
                  f"{len(grid.settings)} settings farther) | {r['cells']} x {grid.steps} "
                  f"| {r['method']} | {', '.join(map(str, r['rungs']))} ({r['eta']}) | {r['spent']} ({r['full']}) "
                  f"| {r['saved']:.0%} | {'; '.join(r['kept'])} | {'yes' if r['right'] else 'no'} | {r['right_rate']:.1%} "
                  f"| {r['saved_mean']:.0%} | {r['regret']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
