"""Job start-up: seconds from a job's process start to its stage's first real work, per stage, against
`python -c "import torch"` timed in the same run.

    python bench/job_start.py [--repeats 1] [--keep DIR]

Writes a one-cell study on `local:tiny-test` (2 steps, 8 held-out problems) into a temporary folder and runs
every stage's real job as Snakemake runs it: `lorarl launch <stage> ... --executor local` (base, train,
evaluate, diagnose: the launcher, then a submitit child process, the job) and `lorarl aggregate` (in the
launcher's own process). A job prints `[lorarl] first <work>: <s> s after the process started` when it reaches
its first SFT step, training step, evaluation batch or diagnostic (lorarl.jobclock); the aggregate's first
table is its summary.md (its mtime). Per stage, two figures: from the job process's start (what the job
itself costs) and from the start of `lorarl launch` (the launcher's start-up and submission included).

Each repeat runs the whole study twice, interleaved: as shipped, and with LORARL_EAGER_IMPORTS=1 (the
optional scikit-learn/scipy imports of transformers not deferred, as before lorarl.lazy_imports), each in a
fresh results folder whose MLflow store is made beforehand (a study's first tracked job makes it: about
50 alembic migrations, several seconds, which would land on the train job here). `import torch` is timed
before each study run. Printed: the medians, and each figure over the median `import torch`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STUDY = {
    "name": "jobstart",
    "defaults": {"model": "local:tiny-test", "task": {"name": "synthetic", "n_train": 64, "n_eval": 8},
                 "adapter": {"rank": 2, "alpha": 4},
                 "train": {"steps": 2, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16,
                           "lr": 1e-3},
                 "eval": {"max_new_tokens": 16}},
    "axes": {"seed": {"field": "seed", "prefix": "s", "values": [0]}},
}
JOBS = [("base", "-", "tiny-test"), ("train", "study", "s0"), ("evaluate", "study", "s0"),
        ("evaluate", "study", "base"), ("diagnose", "study", "s0")]  # (stage, study, target), in pipeline order
LINE = re.compile(r"\[lorarl\] first (.+?): ([0-9.]+) s after the process started \(epoch ([0-9.]+)\)")
LOGS = re.compile(r"logs in (\S+)")


def env(eager: bool) -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out.pop("LORARL_EAGER_IMPORTS", None)
    return {**out, "LORARL_EAGER_IMPORTS": "1"} if eager else out


def import_torch_s() -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.time() - t0


def launch(stage: str, study: str, target: str, results: Path, eager: bool) -> dict:
    """One job through `lorarl launch`; its first-work line from the job's log."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "lorarl.cli", "launch", stage, study, target, "--results",
                           str(results), "--executor", "local"], capture_output=True, text=True, env=env(eager))
    if proc.returncode != 0:
        sys.exit(f"{stage} {target} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    folder = Path(LOGS.search(proc.stdout).group(1))
    log = max(folder.glob("*_log.out"), key=lambda p: p.stat().st_mtime).read_text()
    m = LINE.search(log)
    if m is None:
        sys.exit(f"{stage} {target}: no first-work line in {folder}")
    return {"work": m.group(1), "job": float(m.group(2)), "launch": float(m.group(3)) - t0}


def aggregate(study: str, results: Path) -> dict:
    """`lorarl aggregate`: its first table is summary.md."""
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "lorarl.cli", "aggregate", study, "--results", str(results)],
                   check=True, capture_output=True, env=env(False))
    first = (results / STUDY["name"] / "tables" / "summary.md").stat().st_mtime - t0
    return {"work": "table", "job": first, "launch": first}


def study_run(workdir: Path, eager: bool) -> dict[str, dict]:
    results = workdir / ("eager" if eager else "deferred")
    study = str(workdir / "study.yaml")
    results.mkdir(parents=True)  # the MLflow store made beforehand: in a study only the first tracked job makes it
    subprocess.run([sys.executable, "-c", "import sys; from lorarl.tracking.sqlite_store import ensure; "
                    "ensure(f'sqlite:///{sys.argv[1]}/mlflow.db')", str(results.resolve())], check=True, env=env(False))
    out = {}
    for stage, s, target in JOBS:
        key = stage if target != "base" else "evaluate (base model)"
        out[key] = launch(stage, study if s == "study" else s, target, results, eager)
        print(f"  {'eager' if eager else 'deferred'} {key}: {out[key]['job']:.2f} s", flush=True)
    out["aggregate"] = aggregate(study, results)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1, help="study runs per variant (default 1)")
    p.add_argument("--keep", type=Path, default=None, help="work here and keep the results (default: a temp dir)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "study.yaml").write_text(yaml.safe_dump(STUDY))
        torch_s, runs = [], {False: [], True: []}
        for r in range(args.repeats):
            for eager in ((False, True) if r % 2 == 0 else (True, False)):
                torch_s.append(import_torch_s())
                print(f"repeat {r}: import torch {torch_s[-1]:.2f} s", flush=True)
                # a fresh results folder per study run (training would resume otherwise)
                shutil.rmtree(workdir / ("eager" if eager else "deferred"), ignore_errors=True)
                runs[eager].append(study_run(workdir, eager))
    t = statistics.median(torch_s)
    load = os.getloadavg()
    print(f"\n`python -c \"import torch\"`: median {t:.2f} s over {len(torch_s)} runs "
          f"({', '.join(f'{x:.2f}' for x in torch_s)}); load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"{os.cpu_count()} CPUs\n")
    print("| stage | first real work | job process → it, s | × import torch | eager imports, s | saved, s "
          "| `lorarl launch` → it, s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key, first in runs[False][0].items():
        job = statistics.median(run[key]["job"] for run in runs[False])
        eager = statistics.median(run[key]["job"] for run in runs[True])
        via = statistics.median(run[key]["launch"] for run in runs[False])
        print(f"| {key} | {first['work']} | {job:.2f} | {job / t:.2f} | {eager:.2f} | {eager - job:.2f} | {via:.2f} |")


if __name__ == "__main__":
    main()
