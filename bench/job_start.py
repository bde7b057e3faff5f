"""Job start-up: seconds from a job's process start to its stage's first real work, per stage, against
`python -c "import torch"` timed in the same run.

    python bench/job_start.py [--repeats 3] [--keep DIR]

Writes a one-cell study on `local:tiny-test` (2 steps, 8 held-out problems) into a temporary folder and runs
every stage's real job as Snakemake runs it: `lorarl launch <stage> ... --executor local` (base, train,
evaluate, diagnose: the launcher, then a submitit child process, the job) and `lorarl aggregate` (in the
launcher's own process). A job prints `[lorarl] first <work>: <s> s after the process started, <c> s of CPU`
when it reaches its first SFT step, training step, evaluation batch or diagnostic (lorarl.jobclock); the
aggregate's first table is its summary.md (its mtime; its CPU read from /proc as it appears). Per stage: wall
and CPU seconds from the job process's start (the CPU seconds are what a busy 2-core machine charges; the
wall grows with its load), and the wall from the start of `lorarl launch` (launcher and submission included).

Each repeat runs the whole study twice, interleaved: as shipped, and with LORARL_EAGER_IMPORTS=1 (the
optional scikit-learn/scipy imports of transformers not deferred, as before lorarl.lazy_imports), each in a
fresh results folder whose MLflow store is made beforehand (a study's first tracked job makes it: about
50 alembic migrations, several seconds, which would land on the train job here). `import torch` is timed
(wall and CPU) before each study run. Printed: the medians, and the CPU over `import torch`'s.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
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
LINE = re.compile(r"\[lorarl\] first (.+?): ([0-9.]+) s after the process started, ([0-9.]+) s of CPU "
                  r"\(epoch ([0-9.]+)\)")
LOGS = re.compile(r"logs in (\S+)")


def env(eager: bool) -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out.pop("LORARL_EAGER_IMPORTS", None)
    return {**out, "LORARL_EAGER_IMPORTS": "1"} if eager else out


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def import_torch() -> dict:
    """`python -c "import torch"`: wall and CPU seconds."""
    t0, c0 = time.time(), children_cpu_s()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return {"wall": time.time() - t0, "cpu": children_cpu_s() - c0}


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
    return {"work": m.group(1), "wall": float(m.group(2)), "cpu": float(m.group(3)), "launch": float(m.group(4)) - t0}


def aggregate(study: str, results: Path) -> dict:
    """`lorarl aggregate`: its first table is summary.md; the process's CPU read from /proc when it appears."""
    table = results / STUDY["name"] / "tables" / "summary.md"
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "lorarl.cli", "aggregate", study, "--results", str(results)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env(False))
    cpu = None
    while cpu is None and proc.poll() is None:
        if table.exists():
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        time.sleep(0.01)
    if proc.wait() != 0 or cpu is None:
        sys.exit(f"aggregate failed or wrote no table:\n{proc.stderr.read()[-4000:]}")
    first = table.stat().st_mtime - t0
    return {"work": "table", "wall": first, "cpu": cpu, "launch": first}


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
        print(f"  {'eager' if eager else 'deferred'} {key}: {out[key]['wall']:.2f} s, {out[key]['cpu']:.2f} s of CPU",
              flush=True)
    out["aggregate"] = aggregate(study, results)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1, help="study runs per variant (default 1; the docs: 3)")
    p.add_argument("--keep", type=Path, default=None, help="work here and keep the results (default: a temp dir)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "study.yaml").write_text(yaml.safe_dump(STUDY))
        torch_runs, runs, load0 = [], {False: [], True: []}, os.getloadavg()
        for r in range(args.repeats):
            for eager in ((False, True) if r % 2 == 0 else (True, False)):
                torch_runs.append(import_torch())
                print(f"repeat {r}: import torch {torch_runs[-1]['wall']:.2f} s, {torch_runs[-1]['cpu']:.2f} s of CPU",
                      flush=True)
                # a fresh results folder per study run (training would resume otherwise)
                shutil.rmtree(workdir / ("eager" if eager else "deferred"), ignore_errors=True)
                runs[eager].append(study_run(workdir, eager))
    med = {k: statistics.median(t[k] for t in torch_runs) for k in ("wall", "cpu")}
    load = os.getloadavg()
    print(f"\n`python -c \"import torch\"`: median {med['wall']:.2f} s, {med['cpu']:.2f} s of CPU, "
          f"over {len(torch_runs)} runs; load average {load0[0]:.1f} at the start, "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; {os.cpu_count()} CPUs\n")
    print("| stage | first real work | wall s | CPU s | CPU / import torch's | eager imports: CPU s | CPU saved, s "
          "| wall from `lorarl launch`, s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for key, first in runs[False][0].items():
        wall, cpu, via = (statistics.median(run[key][k] for run in runs[False]) for k in ("wall", "cpu", "launch"))
        eager = statistics.median(run[key]["cpu"] for run in runs[True])
        print(f"| {key} | {first['work']} | {wall:.2f} | {cpu:.2f} | {cpu / med['cpu']:.2f} | {eager:.2f} | "
              f"{eager - cpu:.2f} | {via:.2f} |")

if __name__ == "__main__":
    main()
