"""CPU seconds of one tiny study through `snakemake all`, per checkout, side by side: what a Snakemake test's jobs
cost the machine (CI is CPU-bound: docs/contributing.md), and whether a change made every job dearer.

    python bench/study_cpu.py [--checkout DIR ...] [--seeds 1] [--steps 2] [--keep DIR]

Each checkout (default: this one; give two to compare, e.g. a `git worktree add` of an older commit) runs the
same one-model study on `local:tiny-test` (base model build, train, evaluate of the cell and of the base model,
diagnose, aggregate: 6 jobs per seed-cell plus the shared base) in a folder laid out as a repo root (its
Snakefile, workflow/ and profiles/ linked from that checkout, PYTHONPATH that checkout), all checkouts at the same
time, so the machine's load is the same for each. Printed per checkout: wall seconds, CPU seconds (user+sys of
`snakemake` and every process it waited for: launchers, job processes, grading workers), the jobs Snakemake ran,
and each checkout's CPU over the first one's. The interpreter is this one (`sys.executable`) for every checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LINKED = ("Snakefile", "workflow", "profiles")


def study(seeds: int, steps: int) -> dict:
    return {"name": "studycpu",
            "defaults": {"model": "local:tiny-test", "task": {"name": "synthetic", "n_train": 16, "n_eval": 4},
                         "adapter": {"rank": 2, "alpha": 4},
                         "train": {"steps": steps, "prompts_per_step": 2, "generations": 2,
                                   "max_completion_length": 8, "lr": 1e-3, "checkpoint_every": 0},
                         "eval": {"max_new_tokens": 4, "batch_size": 4}},
            "axes": {"seed": {"field": "seed", "prefix": "s", "values": list(range(seeds))}}}


def run_one(checkout: Path, root: Path, spec: dict) -> dict:
    """`snakemake all` of `spec` in `root` with `checkout`'s workflow and code; wall, CPU, jobs run."""
    root.mkdir(parents=True)
    for name in LINKED:
        (root / name).symlink_to(checkout / name)
    (root / "study.yaml").write_text(yaml.safe_dump(spec))
    config = yaml.safe_load((checkout / "config" / "config.yaml").read_text())
    config.update({"studies": [str(root / "study.yaml")], "results": "results", "launcher": "local", "slurm": {}})
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(checkout), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "snakemake", "all", "--config", f"studies={json.dumps([str(root / 'study.yaml')])}"]
    t0 = time.time()
    with open(root / "snakemake.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # the rusage of snakemake and everything it waited for
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    text = (root / "snakemake.log").read_text()
    jobs = re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", text)
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "jobs": len([j for j in jobs if j != "all"]), "log": root / "snakemake.log"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkout", action="append", type=Path, help="a repository root (repeatable; default: this one)")
    p.add_argument("--seeds", type=int, default=1, help="cells (one per seed)")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps per cell")
    p.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    args = p.parse_args(argv)
    checkouts = [c.resolve() for c in (args.checkout or [REPO])]
    for c in checkouts:
        if not (c / "Snakefile").exists():
            p.error(f"--checkout {c}: no Snakefile there; allowed: a lorarl repository root")
    if args.seeds < 1 or args.steps < 1:
        p.error(f"--seeds {args.seeds} / --steps {args.steps}: allowed: integers >= 1")
    base = args.keep or Path(tempfile.mkdtemp(prefix="study_cpu-"))
    spec = study(args.seeds, args.steps)
    try:
        with ThreadPoolExecutor(len(checkouts)) as pool:
            runs = list(pool.map(lambda ic: run_one(ic[1], base / f"run{ic[0]}", spec), enumerate(checkouts)))
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"one study of {args.seeds} cell(s) x {args.steps} steps through `snakemake all`, "
          f"{len(checkouts)} checkout(s) side by side, {os.cpu_count()} CPUs")
    print(f"{'checkout':<40} {'rc':>3} {'jobs':>5} {'wall s':>8} {'CPU s':>8} {'CPU/job':>8} {'CPU ratio':>10}")
    for c, r in zip(checkouts, runs):
        print(f"{str(c):<40} {r['rc']:>3} {r['jobs']:>5} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
              f"{r['cpu_s'] / max(r['jobs'], 1):>8.1f} {r['cpu_s'] / runs[0]['cpu_s']:>10.2f}")
    return max(r["rc"] != 0 for r in runs)


if __name__ == "__main__":
    sys.exit(main())
