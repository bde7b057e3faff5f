"""Run the two real CPU grids that bench/adaptive_savings.py replays (issue 40, item 5b), and record them.

    python bench/adaptive_grids.py run --workdir DIR [--grids demo,wide] [--workers 2]
    python bench/adaptive_grids.py record --workdir DIR      # -> bench/results/adaptive_grids/<grid>.json

Two full grids, every cell trained to its last step with held-out snapshots every 10 steps, on the demo's
tiny model (``local:tiny-arith``, built here if DIR has none) and its synthetic arithmetic task (200 held-out
problems, greedy pass@1):

* ``demo``: the demo's shape: LoRA rank {1, 8} x beta {0, 0.05} x seed {0, 1}, 80 steps (8 cells);
* ``wide``: method {lora, rslora, dora} x rank {1, 4, 16} x seed {0, 1, 2}, 60 steps of 4 prompts (27 cells).

``run`` trains and evaluates every cell with lorarl's own stages (``lorarl.pipeline.jobs.launch.run_stage``:
train, then evaluate every target, the final adapter and each snapshot), in ``--workers`` processes, each
working through its share of the cells, so that no per-job start-up costs minutes on a 2-core machine; the
wide grid's three seeds of a setting train as one pack (lorarl.pack: each cell still its own adapter,
optimiser, RNG streams and outputs). What each cell writes is what ``snakemake all`` would write. ``record`` keeps only what the replay needs: per cell
its axis labels and, at every snapshot step and the last step, one character per held-out problem (``1``
solved, ``0`` not; problems in sorted id order). Those files are committed; the grids themselves are not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "adaptive_grids"
DEMO = {
    "model": "local:tiny-arith",
    "task": {"name": "synthetic", "seed": 1234, "n_train": 2000, "n_eval": 200},
    "adapter": {"method": "lora", "rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
    "train": {"lr": 5.0e-4, "steps": 80, "prompts_per_step": 8, "generations": 4, "max_completion_length": 40,
              "temperature": 1.0, "loss_type": "grpo"},
    "eval": {"max_new_tokens": 40, "eval_every": 10},
}
GRIDS = {
    "demo": {"name": "grid_demo", "defaults": DEMO, "axes": {
        "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 8]},
        "kl": {"field": "train.beta", "prefix": "kl", "values": [0.0, 0.05]},
        "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}},
    "wide": {"name": "grid_wide", "defaults": {**DEMO, "train": {**DEMO["train"], "steps": 60, "prompts_per_step": 4}},
             "axes": {
        "method": {"field": "adapter.method", "values": ["lora", "rslora", "dora"]},
        "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 4, 16]},
        "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}}},
}


def study_file(workdir: Path, grid: str) -> Path:
    import yaml

    p = workdir / f"{GRIDS[grid]['name']}.yaml"
    p.write_text(yaml.safe_dump(GRIDS[grid], sort_keys=False))
    return p


def _model(workdir: Path) -> None:
    from lorarl.models import build_base, resolve_model

    out = Path(resolve_model("local:tiny-arith", workdir))
    if not (out / "config.json").exists():
        build_base("tiny-arith", out, threads=1)


def _worker(study: str, packs: list[str], results: str) -> None:
    """Each pack (a comma list of cells) trained together, then each member evaluated."""
    from lorarl.pack import publish
    from lorarl.pipeline.jobs.launch import run_stage
    from lorarl.language.study import cell_table, load_study

    table = cell_table(load_study(study))
    name = Path(study).stem
    for pack in packs:
        cells = [c for c in pack.split(",") if not (Path(results) / name / c / "eval" / "synthetic.json").exists()]
        if not cells:
            continue
        t0 = time.time()
        if len(cells) == 1:
            run_stage("train", study, cells[0], results, threads=1)
        else:
            run_stage("pack", study, ",".join(cells), results, threads=1)
            for c in cells:
                publish.publish(results, name, c, table.cell(c).hash)
        for c in cells:
            run_stage("evaluate", study, c, results, threads=1)
        print(f"[grid] {', '.join(cells)}: {time.time() - t0:.0f}s", flush=True)


def run(workdir: Path, grids: list[str], workers: int) -> None:
    from lorarl.language.study import cell_table, load_study

    workdir.mkdir(parents=True, exist_ok=True)
    _model(workdir)
    for grid in grids:
        sf = study_file(workdir, grid)
        table = cell_table(load_study(sf))
        ids = table.ids
        groups: dict = {}
        for c in table.cells:  # the wide grid: a setting's seeds in one pack
            key = tuple(v for a, v in c.axes.items() if a != "seed") if grid == "wide" else c.id
            groups.setdefault(key, []).append(c.id)
        packs = [",".join(g) for g in groups.values()]
        t0 = time.time()
        procs = [subprocess.Popen([sys.executable, __file__, "worker", str(sf), ";".join(packs[w::workers]),
                                   "--workdir", str(workdir)], env={**os.environ, "OMP_NUM_THREADS": "1"})
                 for w in range(workers)]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit(f"grid {grid}: a worker failed")
        print(f"[grid] {grid}: {len(ids)} cells in {time.time() - t0:.0f}s", flush=True)


def record(workdir: Path, grids: list[str]) -> None:
    from lorarl.language.evalplan.plan import snapshot_steps
    from lorarl.language.study import cell_table, load_study

    OUT.mkdir(parents=True, exist_ok=True)
    for grid in grids:
        study = load_study(study_file(workdir, grid))
        cells = {}
        problems = None
        for c in cell_table(study).cells:
            cdir = workdir / study.name / c.id / "eval"
            steps = snapshot_steps(c.config) + [c.config.train.steps]
            solved = {}
            for st in steps:
                name = "synthetic.jsonl" if st == c.config.train.steps else f"synthetic@{st}.jsonl"
                rows = sorted((json.loads(x) for x in (cdir / name).read_text().splitlines() if x.strip()),
                              key=lambda r: str(r["problem_id"]))
                ids = [str(r["problem_id"]) for r in rows]
                problems = problems or ids
                assert ids == problems, (c.id, st)
                solved[str(st)] = "".join("1" if r["correct"] else "0" for r in rows)
            cells[c.id] = {"axes": c.axes, "solved": solved}
        doc = {"grid": grid, "study": GRIDS[grid], "axes": list(GRIDS[grid]["axes"]), "metric": "synthetic/pass@1",
               "problems": len(problems),
               "seed_axis": study.seed_axis, "cells": cells}
        (OUT / f"{grid}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"[grid] {grid}: {len(cells)} cells recorded -> {OUT / f'{grid}.json'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["run", "record", "worker"])
    ap.add_argument("study", nargs="?", help="worker: the study file")
    ap.add_argument("cells", nargs="?", help="worker: packs (comma lists of cell ids) separated by ;")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--grids", default="demo,wide")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    if args.action == "worker":
        _worker(args.study, args.cells.split(";"), str(args.workdir))
    elif args.action == "run":
        run(args.workdir, args.grids.split(","), args.workers)
    else:
        record(args.workdir, args.grids.split(","))


if __name__ == "__main__":
    main()
