"""Planning cost at scale: `lorarl cells` and `snakemake -n all` on generated studies of 100, 1,000 and
10,000 cells, next to bare Snakemake with the same rules and jobs, measured in the same run.

Each study is rank x KL x lr x seed (1 base model, 1 benchmark), so lorarl plans
1 base_model + N train + (N + 1) evaluate + N diagnose + 1 aggregate + 1 all jobs. The bare workflow
has the same six rules, the same outputs, logs, params and input functions per job, but its cell
list is a plain text file and its params are constants (what any Snakemake workflow pays). Both dry
runs print the same per-job lines to a file, and the job totals are checked to be equal.

    python bench/dag_scale.py                      # 100, 1000, 10000 cells
    python bench/dag_scale.py --sizes 100,1000     # skip the 10k dry runs
    python bench/dag_scale.py --repeat 3           # best of 3 per measurement

Prints wall and CPU seconds (CPU = user + sys of the child, steadier on a loaded machine) and the
ratios lorarl / bare. Targets (issue 10): dry run <= 1.5x bare at 1k and 10k; `lorarl cells` of 10k <= 5 s.
Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHAPES = {100: (5, 5, 2, 2), 1000: (10, 10, 5, 2), 10000: (10, 10, 10, 10)}  # rank x kl x lr x seed

BARE = r'''
# Bare Snakemake with lorarl's rule shape: base_model, train, evaluate, diagnose, aggregate, all.
R = "results"
S = "scale"
CELLS = open("cells.txt").read().split()
BASES = ["base"]


def base_input(wildcards):
    return [f"{R}/models/tiny-test"]


def eval_input(wildcards):
    if wildcards.cell in BASES:
        return [f"{R}/models/tiny-test"]
    return [f"{R}/{wildcards.study}/{wildcards.cell}/summary.json", f"{R}/{wildcards.study}/{wildcards.cell}/adapter"]


def targets():
    out = [f"{R}/{S}/tables/summary.md"]
    out += [f"{R}/{S}/{c}/diagnostics.parquet" for c in CELLS]
    out += [f"{R}/{S}/{c}/eval/synthetic.json" for c in CELLS + BASES]
    out += [f"{R}/{S}/{c}/summary.json" for c in CELLS]
    return out


rule all:
    input: targets()
    default_target: True


rule base_model:
    output: directory(f"{R}/models/{{name}}")
    params: stage="base", study="-", target="x", recipe="h", results=R, launcher="local", slurm="{}"
    log: f"{R}/models/.logs/{{name}}.log"
    shell: "touch {output}"


rule train:
    input: base_input
    output:
        summary=f"{R}/{{study}}/{{cell}}/summary.json",
        metrics=f"{R}/{{study}}/{{cell}}/metrics.csv",
        cell_json=f"{R}/{{study}}/{{cell}}/cell.json",
        adapter=directory(f"{R}/{{study}}/{{cell}}/adapter"),
    params: stage="train", study="s.yaml", target="x", config_hash="h", results=R, launcher="local", slurm="{}"
    log: f"{R}/{{study}}/{{cell}}/logs/train.log"
    shell: "touch {output}"


rule evaluate:
    input: eval_input
    output:
        summary=f"{R}/{{study}}/{{cell}}/eval/{{benchmark}}.json",
        samples=f"{R}/{{study}}/{{cell}}/eval/{{benchmark}}.jsonl",
    params: stage="evaluate", study="s.yaml", target="x", eval_target="b", config_hash="h", results=R,
            launcher="local", slurm="{}"
    log: f"{R}/{{study}}/{{cell}}/logs/evaluate-{{benchmark}}.log"
    shell: "touch {output}"


rule diagnose:
    input:
        summary=f"{R}/{{study}}/{{cell}}/summary.json",
        adapter=f"{R}/{{study}}/{{cell}}/adapter",
    output: f"{R}/{{study}}/{{cell}}/diagnostics.parquet"
    params: stage="diagnose", study="s.yaml", target="x", config_hash="h", results=R, launcher="local", slurm="{}"
    log: f"{R}/{{study}}/{{cell}}/logs/diagnose.log"
    shell: "touch {output}"


rule aggregate:
    input: [f"{R}/{S}/{c}/diagnostics.parquet" for c in CELLS] + [f"{R}/{S}/{c}/eval/synthetic.json" for c in CELLS + BASES] + [f"{R}/{S}/{c}/summary.json" for c in CELLS]
    output: md=f"{R}/{{study}}/tables/summary.md", csv=f"{R}/{{study}}/tables/summary.csv"
    params: study="s.yaml", results=R
    log: f"{R}/{{study}}/tables/aggregate.log"
    shell: "touch {output}"
'''


def study(n: int) -> dict:
    r, k, l, s = SHAPES[n]
    return {"name": "scale", "defaults": {"model": "local:tiny-test", "train": {"steps": 3}},
            "axes": {"rank": {"field": "adapter.rank", "prefix": "r", "values": list(range(1, r + 1))},
                     "kl": {"field": "train.beta", "prefix": "kl", "values": [round(0.01 * i, 2) for i in range(k)]},
                     "lr": {"field": "train.lr", "prefix": "lr", "values": [round(1e-4 * (i + 1), 6) for i in range(l)]},
                     "seed": {"field": "seed", "prefix": "s", "values": list(range(s))}}}


def timed(cmd: list[str], cwd: Path, log: Path, timeout: float) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, output); raises on failure or timeout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{text[-3000:]}")
    return wall, cpu, text


def jobs_total(text: str) -> int:
    m = re.search(r"^total\s+(\d+)\s*$", text, re.M)
    return int(m.group(1)) if m else -1


def best(runs: list[tuple[float, float, str]]) -> tuple[float, float, str]:
    return min(runs, key=lambda r: r[0])


def measure(n: int, tmp: Path, repeat: int, timeout: float) -> dict:
    d = tmp / f"n{n}"
    (d / "lorarl").mkdir(parents=True)
    (d / "bare").mkdir()
    sfile = d / "scale.yaml"
    sfile.write_text(yaml.safe_dump(study(n), sort_keys=False))
    py = sys.executable
    cells_cmd = [py, "-m", "lorarl.cli", "cells", str(sfile), "--ids"]
    ids = timed(cells_cmd, d, d / "ids.txt", timeout)[2].split()
    (d / "bare" / "cells.txt").write_text("\n".join(ids) + "\n")
    (d / "bare" / "Snakefile").write_text(BARE)
    lorarl_dry = [py, "-m", "snakemake", "all", "-n", "--snakefile", str(REPO / "Snakefile"), "--directory",
                  str(d / "lorarl"), "--configfile", str(REPO / "config" / "config.yaml"),
                  "--config", f'studies=["{sfile}"]', "results=results"]
    bare_dry = [py, "-m", "snakemake", "all", "-n", "--snakefile", str(d / "bare" / "Snakefile"), "--directory",
                str(d / "bare"), "--cores", "1"]
    cells, lor, bare = [], [], []
    for _ in range(repeat):  # interleaved, so load changes hit both sides alike
        cells.append(timed(cells_cmd, d, d / "cells.log", timeout))
        lor.append(timed(lorarl_dry, REPO, d / "lorarl.log", timeout))
        bare.append(timed(bare_dry, d / "bare", d / "bare.log", timeout))
    c, lo, ba = best(cells), best(lor), best(bare)
    jl, jb = jobs_total(lo[2]), jobs_total(ba[2])
    if jl != jb:
        raise RuntimeError(f"{n} cells: lorarl plans {jl} jobs, bare {jb}: the shapes differ")
    return {"cells": n, "jobs": jl, "cells_wall": c[0], "cells_cpu": c[1], "lorarl_wall": lo[0], "lorarl_cpu": lo[1],
            "bare_wall": ba[0], "bare_cpu": ba[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100,1000,10000", help="comma list of 100, 1000, 10000")
    p.add_argument("--repeat", type=int, default=1, help="best of N per measurement")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    bad = [s for s in sizes if s not in SHAPES]
    if bad:
        sys.exit(f"--sizes: {bad} not in allowed: {', '.join(map(str, SHAPES))}")
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| cells | jobs | `lorarl cells` s (cpu) | lorarl `snakemake -n` s (cpu) | bare `snakemake -n` s (cpu) "
          "| ratio wall | ratio cpu |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="lorarl-dag-") as tmp:
        for n in sizes:
            r = measure(n, Path(tmp), a.repeat, a.timeout)
            print(f"| {n} | {r['jobs']} | {r['cells_wall']:.2f} ({r['cells_cpu']:.2f}) | {r['lorarl_wall']:.2f} "
                  f"({r['lorarl_cpu']:.2f}) | {r['bare_wall']:.2f} ({r['bare_cpu']:.2f}) | "
                  f"{r['lorarl_wall'] / r['bare_wall']:.2f} | {r['lorarl_cpu'] / r['bare_cpu']:.2f} |", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
