"""Fault injection over the whole pipeline: `python -m lorarl.pipeline.drills.faults --kills 20` prints the figures.

A small real study (2 cells x 4 GRPO steps on the tiny CPU model, checkpoints every 2 steps, held-out
evaluation, diagnostics, aggregate; `--cells N`) runs once uninterrupted (the reference). Then, pass
after pass, a fresh copy runs under `snakemake all` while a monitor SIGKILLs processes, one planned at
a time, each at a random point of its life (the others keep going); `snakemake all --config studies=...`
runs again after every invocation with a kill (after `snakemake --unlock --config studies=...` when Snakemake
itself died) until the study completes: the commands the docs give a user, word for word
(lorarl.pipeline.drills.recovery), in a folder laid out as a repo root, so cores, keep-going and rerun-incomplete
come from profiles/default. Kill targets ("stages"): train / evaluate / diagnose = the job process of that stage (the submitit worker);
aggregate = `lorarl aggregate`; launcher = one `lorarl launch` (its job runs on, orphaned); host = the
submit host dies (Snakemake and every `lorarl launch` at once).
The first process seen of a stage with kills left (a launcher: launcher or host, drawn by kills left)
is killed at a point uniform over [0, 90% of that stage's shortest lifetime seen (reference run and
every run since)], counted from the process's own start (/proc), so the short aggregate is hit too; a
kill whose process ended first is counted as missed and retried on the next one (kills not placed move
to the next run); several processes may have a kill planned at once, never more than kills left.
`--workers N` runs N kill loops side by side, each in its own folder with its share of the kills.
Each completed pass is checked against the reference (lorarl.pipeline.drills.fault_checks): every (metric,
step) once in the cell's one MLflow run and metrics.csv, adapters and evaluations equal, no partial or
temporary file among the outputs. Only processes of this user whose working directory or arguments
lie in this run's directory are ever signalled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import yaml

from lorarl.faulthooks import without
from lorarl.io import pid_alive
from lorarl.pipeline.drills import recovery
from lorarl.pipeline.drills.fault_checks import SUMS, check, merge, report

REPO = Path(__file__).resolve().parents[3]
STAGES = ("train", "evaluate", "diagnose", "aggregate", "launcher", "host")
STEPS = 4
KILL_WINDOW = 0.9  # kill points are uniform over [0, this x the stage's shortest reference lifetime]
POLL_S = 0.05  # how often the monitor looks at /proc
UNLOCK, RUN = recovery.COMMANDS["local"]  # every run and recovery: the commands the docs give a user


def study_spec(cells: int = 2) -> dict:
    """The study every run uses: `cells` seeds of one small GRPO cell."""
    return {
        "name": "chaos",
        "defaults": {
            "model": "local:tiny-test",
            "task": {"name": "synthetic", "n_train": 64, "n_eval": 8},
            "adapter": {"rank": 2, "alpha": 4},
            "train": {"steps": STEPS, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16,
                      "lr": 1e-3, "checkpoint_every": 2},
            "eval": {"max_new_tokens": 8},
        },
        "axes": {"seed": {"field": "seed", "prefix": "s", "values": list(range(cells))}},
    }


# ---- processes ------------------------------------------------------------------------------------

def _inside(path: str, wd: str) -> bool:  # not a sibling folder whose name merely starts the same
    return path == wd or path.startswith(wd + "/")


def _procs(workdir: Path) -> list[tuple[int, str]]:
    """(pid, stage) of this run's processes that are kill targets (never anyone else's)."""
    out, me, wd = [], os.getuid(), str(workdir)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if d.stat().st_uid != me:
                continue
            argv = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0") if a]
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if not (_inside(cwd, wd) or any(_inside(a, wd) for a in argv)):
            continue
        if "submitit.core._submit" in argv:  # the worker doing the stage's work (its parent: the controller)
            key = Path(argv[-1]).name.split("-")[0]
            if key in ("train", "evaluate", "diagnose"):
                out.append((int(d.name), key))
            continue
        for i, a in enumerate(argv[:-1]):
            if a.endswith("/lorarl") and argv[i + 1] in ("launch", "aggregate"):
                out.append((int(d.name), "launcher" if argv[i + 1] == "launch" else "aggregate"))
                break
    pids = {pid for pid, _ in out}
    return [(pid, st) for pid, st in out if _ppid(pid) not in pids]  # not a launcher's child between fork and exec


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()


def _ppid(pid: int) -> int:
    try:
        return int(_stat(pid)[1])
    except (OSError, ValueError, IndexError):
        return -1


def _now() -> float:  # seconds since boot: the clock of /proc's process start times
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _started(pid: int, default: float) -> float:
    """When the process started (`_now()` clock), from /proc (its field 22, clock ticks since boot)."""
    try:
        return int(_stat(pid)[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return default




def _kill(pid: int) -> bool:
    try:
        return os.kill(pid, signal.SIGKILL) is None
    except OSError:
        return False


# ---- snakemake ------------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    env = without(os.environ)  # the drill's kills are its own: no test hook in its runs
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    return env


@dataclass
class Invocation:
    rc: int
    killed: list[str]  # stages killed in this invocation, in order
    missed: list[str] = field(default_factory=list)  # planned kills whose process ended first
    lifetimes: dict[str, list[float]] = field(default_factory=dict)


def _pick(stage: str, remaining: dict[str, int], rng: random.Random) -> str | None:
    """Which kill a newly seen process of `stage` gets, if any (a launcher: launcher or host, by kills left)."""
    choices = {stage: remaining.get(stage, 0)}
    if stage == "launcher":
        choices["host"] = remaining.get("host", 0)
    total = sum(choices.values())
    if total <= 0:
        return None
    x = rng.uniform(0, total)
    for name, n in choices.items():
        if x < n:
            return name
        x -= n
    return name


def run_snakemake(workdir: Path, remaining: dict[str, int], delays: dict[str, float], rng: random.Random,
                  log: Path, timeout_s: float = 1800, stop_at: float = float("inf")) -> Invocation:
    """One `snakemake all`; SIGKILL processes of stages that still need kills (`remaining`, decremented),
    each at a random point of its life; a plan per process, never more plans than kills left (`host` =
    Snakemake + every launcher, planned on a launcher's life, done even if that launcher ended first; it
    ends the invocation). No kill is planned after `stop_at` (time.time()). Killed processes' lifetimes
    are not reported."""
    with open(log, "a") as fh:
        proc = subprocess.Popen(recovery.argv(RUN, str(workdir / "study.yaml")), cwd=workdir, stdout=fh,
                                stderr=subprocess.STDOUT, env=_env())
    seen: dict[int, tuple[str, float]] = {}  # pid -> (stage, start)
    life: dict[str, list[float]] = {}
    plan: dict[int, tuple[str, float]] = {}  # pid -> (kill, when)
    killed: list[str] = []
    missed: list[str] = []
    t_end = _now() + timeout_s
    while proc.poll() is None and _now() < t_end:
        current = dict(_procs(workdir))
        now = _now()
        for pid, (stage, t0) in list(seen.items()):
            if pid not in current and not pid_alive(pid):
                life.setdefault(stage, []).append(now - t0)
                del seen[pid]
                if pid in plan and plan[pid][0] != "host":
                    missed.append(plan.pop(pid)[0])  # it ended before its kill: wait for another one
        for pid, stage in current.items():
            if pid in seen:
                continue
            seen[pid] = (stage, _started(pid, now))
            planned = [k for k, _ in plan.values()]
            avail = {s: n - planned.count(s) for s, n in remaining.items()}
            kill = _pick(stage, avail, rng) if time.time() < stop_at else None
            if kill is not None:
                plan[pid] = (kill, seen[pid][1] + rng.uniform(0, KILL_WINDOW * delays.get(kill, 5.0)))
        for pid, (stage, when) in list(plan.items()):
            if now < when:
                continue
            del plan[pid]
            if stage == "host":  # the submit host dies: Snakemake and every launcher; jobs run on
                _kill(proc.pid)
                for p, st in _procs(workdir):
                    if st in ("launcher", "aggregate"):
                        _kill(p)
                killed.append("host")
                remaining["host"] -= 1
                break
            if pid_alive(pid) and _kill(pid):
                killed.append(stage)
                remaining[stage] -= 1
                seen.pop(pid, None)  # its lifetime was cut short: not a lifetime
            else:
                missed.append(stage)
        time.sleep(POLL_S)
    if proc.poll() is None:
        proc.kill()
    return Invocation(proc.wait(), killed, missed, life)


# ---- the experiment -------------------------------------------------------------------------------

def prepare(root: Path, cells: int = 2) -> tuple[Path, Path, dict[str, float]]:
    """A template workdir with the tiny base model built, and the uninterrupted reference run.
    Returns (template, reference results, shortest process lifetime per stage in the reference)."""
    template = root / "template"
    template.mkdir(parents=True, exist_ok=True)
    (template / "study.yaml").write_text(yaml.safe_dump(study_spec(cells)))
    recovery.workspace(template, _config(template))
    subprocess.run(["snakemake", "results/models/tiny-test/config.json"], cwd=template, env=_env(),
                   check=True, capture_output=True)
    ref = clone(template, root / "reference")
    inv = run_snakemake(ref, {}, {}, random.Random(0), ref / "snakemake.log")
    if inv.rc != 0:
        raise RuntimeError(f"the reference run failed; see {ref / 'snakemake.log'}")
    delays = {s: min(v) for s, v in inv.lifetimes.items()}
    delays["host"] = delays.get("launcher", 30.0)  # the host dies during a launcher's life
    return template, ref / "results", delays


def clone(template: Path, dest: Path) -> Path:
    """A copy of the template (absolute study path rewritten: every run is self-contained)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(template, dest, symlinks=True)
    recovery.write_config(dest, _config(dest))
    return dest


def _config(root: Path) -> dict:
    return {"studies": [str(root / "study.yaml")], "results": "results", "launcher": "local", "slurm": {}}


def one_pass(template: Path, dest: Path, remaining: dict[str, int], delays: dict[str, float], rng: random.Random,
             max_invocations: int, stop_at: float = float("inf")) -> tuple[dict[str, int], int, bool, list[str]]:
    """Run a fresh copy to completion while killing (`snakemake all` again after each invocation with a
    kill); `remaining` is decremented. Returns (kills per stage, invocations, completed, missed kills)."""
    clone(template, dest)
    log = dest / "snakemake.log"
    kills: dict[str, int] = {}
    missed: list[str] = []
    for n in range(1, max_invocations + 1):
        inv = run_snakemake(dest, remaining, delays, rng, log, stop_at=stop_at)
        missed += inv.missed
        for stage, lives in inv.lifetimes.items():  # the load changes: windows follow the shortest life seen
            delays[stage] = min([delays.get(stage, lives[0]), *lives])
        delays["host"] = delays.get("launcher", delays.get("host", 30.0))
        for stage in inv.killed:
            kills[stage] = kills.get(stage, 0) + 1
        if "host" in inv.killed:  # Snakemake died holding its lock: the documented recovery (then RUN again)
            recovery.run(UNLOCK, dest, _env(), log, str(dest / "study.yaml"))
        if inv.killed:
            continue
        if inv.rc == 0:
            return kills, n, True, missed
    return kills, max_invocations, False, missed


def work(index: int, root: Path, template: Path, ref: Path, delays: dict[str, float], budget: dict[str, int],
         per_pass: int, seed: int, stop_at: float = float("inf")) -> dict:
    """One kill loop (worker `index`) in its own folder: passes until its `budget` of kills is placed
    (or `stop_at` passed: no new pass, no new kill; the pass under way runs to completion)."""
    rng = random.Random(seed * 1000 + index)
    remaining = dict(budget)
    fig: dict = {k: 0 for k in SUMS} | {"max_abs_diff": 0.0, "bad_outputs": [], "kills": {s: 0 for s in budget},
                                        "missed": {s: 0 for s in budget}}
    most = max(budget.values(), default=0)
    for i in range(max(3, 3 * most // per_pass)):
        if not any(remaining.values()) or time.time() >= stop_at:
            break
        dest = root / f"w{index}" / f"pass-{i}"
        cap = {s: min(n, per_pass) for s, n in remaining.items()}
        kills, n_inv, done, missed = one_pass(template, dest, cap, delays, rng, max_invocations=sum(cap.values()) + 4,
                                              stop_at=stop_at)
        for s, n in kills.items():
            remaining[s] -= n
            fig["kills"][s] += n
        fig["missed"] = {s: fig["missed"].get(s, 0) + missed.count(s) for s in fig["missed"] | dict.fromkeys(missed)}
        res = check(dest / "results", ref, steps=STEPS) if done else {}
        add = {"passes": 1, "invocations": n_inv, "completed": int(done), **{k: res.get(k, 0) for k in SUMS[3:]}}
        for k, v in add.items():
            fig[k] += v
        fig["max_abs_diff"] = max(fig["max_abs_diff"], res.get("max_abs_diff", 0.0))
        fig["bad_outputs"] += res.get("bad_outputs", [])
        print(f"[w{index}] pass {i}: kills {kills}, missed {missed}, {n_inv} snakemake runs, "
              + ("completed" if done else "DID NOT COMPLETE") + (f", {json.dumps(res)}" if res else ""), flush=True)
        if done:
            shutil.rmtree(dest, ignore_errors=True)
        if not kills and not done:
            break
    return fig


def _shares(kills: int, stages: tuple[str, ...], workers: int) -> list[dict[str, int]]:
    """Each worker's kills per stage: `kills` per stage split as evenly as possible."""
    return [{s: kills // workers + (w < kills % workers) for s in stages} for w in range(workers)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lorarl.pipeline.drills.faults", description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per stage (default 20)")
    p.add_argument("--per-pass", type=int, default=2, help="at most this many kills per stage in one study run")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {', '.join(STAGES)}")
    p.add_argument("--cells", type=int, default=2, help="cells (seeds) of the study, 1 to 8 (default 2)")
    p.add_argument("--workers", type=int, default=1, help="kill loops run side by side (each its own folder)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds after which no new kill or pass starts (passes under way finish); default none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the runs go (default: a temporary directory)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    stages = tuple(s for s in args.stages.split(",") if s)
    bad = [s for s in stages if s not in STAGES]
    problems = [f"--stages {','.join(bad)}: allowed {', '.join(STAGES)}"] if bad or not stages else []
    for name, value, lo, hi in (("kills", args.kills, 1, 10_000), ("per-pass", args.per_pass, 1, 10_000),
                                ("cells", args.cells, 1, 8), ("workers", args.workers, 1, 64)):
        if not lo <= value <= hi:
            problems.append(f"--{name} {value}: allowed {lo} to {hi}")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    root = Path(args.workdir or tempfile.mkdtemp(prefix="lorarl-faults-")).resolve()
    t0 = time.time()
    template, ref, delays = prepare(root, args.cells)
    print(f"reference run done in {time.time() - t0:.0f}s; shortest process lifetimes (s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(delays.items())), flush=True)
    shares = [b for b in _shares(args.kills, stages, args.workers) if any(b.values())]
    stop_at = t0 + args.time_limit if args.time_limit else float("inf")
    jobs = [(i, root, template, ref, delays, b, args.per_pass, args.seed, stop_at) for i, b in enumerate(shares)]
    if len(jobs) == 1:
        figs = [work(*jobs[0])]
    else:
        with ProcessPoolExecutor(len(jobs), mp_context=get_context("spawn")) as pool:
            figs = list(pool.map(work, *zip(*jobs)))
    figures = merge(figs)
    figures["workers"] = len(jobs)
    figures["wall_s"] = round(time.time() - t0, 1)
    print(report(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    ok = (figures["completed"] == figures["passes"] and not figures["lost"] and not figures["duplicated"]
          and not figures.get("extra")
          and not figures["bad_outputs"] and not figures["extra_runs"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
