"""Crash replay of an adaptive study (issue 40, item 5a): random SIGKILLs change no decision.

    python bench/adaptive_replay.py [--kills 100] [--rules sha,asha] [--seed 0] [--workdir DIR]

A study of 27 cells (rank {4, 8, 16} x lr {1e-4, 3e-4, 1e-3} x seed {0, 1, 2}; 60 steps, held-out snapshots
every 10) with a `search:` block (rungs 10, 20, 40; eta 3) is replayed from recorded per-rung metrics
(synthetic: each setting a level plus seed noise; two settings tie exactly; cell r8-lr3e-4-s1 diverges at
step 15). Three kinds of real processes run at once:

* the controller (``--role controller``): the decision loop, lorarl.adaptive.ledger.update_search over
  and over (read the cells' rung records, decide, write ``results/<study>/adaptive/search.json``);
* jobs (``--role job``), one per cell and launch: "train" the cell to the step its setting may reach
  (lorarl.adaptive.ledger.cell_plan of the ledger the driver last read) and write each rung's evaluation
  record ``eval/synthetic@<step>.json`` atomically (the evaluate stage's format), 50-250 ms apart;
* this driver: the cluster and the user. It starts the controller (again after it died), starts a job for
  every cell whose plan needs a record it lacks, and SIGKILLs (``os.kill(pid, SIGKILL)``) the controller
  or a running job (a fair coin, every 50-500 ms; a controller dies 1 time in 5 while it starts, else
  0-300 ms into its decision loop, reading records or writing the ledger).

Per rule (sha, asha) the study runs once without kills, then again and again with kills (each a whole
study, in a fresh folder) until ``--kills`` SIGKILLs are spent. The decisions of every final ledger
(setting, rung, decision) are compared with the uninterrupted run's, and so are the ledgers' bytes.
Prints per run the kills (controller, of which inside its loop / jobs), controller restarts, jobs
started, stray temporary files left by killed writes, and the decision differences (0 expected).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNGS = [10, 20, 40]
FAIL_CELL, FAIL_STEP = "r8-lr3e-4-s1", 15
STUDY = {
    "name": "replay",
    "defaults": {"model": "local:tiny-test", "task": {"name": "synthetic", "n_train": 16, "n_eval": 8},
                 "adapter": {"method": "lora", "rank": 4, "alpha": 8},
                 "train": {"steps": 60, "prompts_per_step": 2, "generations": 2, "lr": 1.0e-4},
                 "eval": {"max_new_tokens": 8, "eval_every": 10}},
    "axes": {"rank": {"field": "adapter.rank", "prefix": "r", "values": [4, 8, 16]},
             "lr": {"field": "train.lr", "prefix": "lr", "values": [{"label": "1e-4", "set": {"train.lr": 1e-4}},
                                                                  {"label": "3e-4", "set": {"train.lr": 3e-4}},
                                                                  {"label": "1e-3", "set": {"train.lr": 1e-3}}]},
             "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}},
}


def truth(cells: list[str]) -> dict[str, dict[str, float]]:
    """The recorded per-rung metrics: a level per setting (rising with the step), seed noise per cell;
    settings r4-lr1e-3 and r16-lr1e-4 are identical (an exact tie at every rung)."""
    rng = random.Random(1234)
    level = {}
    for c in cells:
        setting = c.rsplit("-s", 1)[0]
        level.setdefault(setting, round(rng.uniform(0.2, 0.6), 2))
    level["r16-lr1e-4"] = level["r4-lr1e-3"]
    out = {}
    for c in cells:
        setting, seed = c.rsplit("-s", 1)
        noise = [0.0, 0.02, -0.02][int(seed)]
        out[c] = {str(r): round(level[setting] + 0.1 * r / 60 + noise, 4) for r in RUNGS}
    return out


def atomic_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def job(wd: Path, cell: str, config_hash: str, until: int) -> None:
    """Train ``cell`` to step ``until``: write each missing rung record on the way (a few ms per rung)."""
    values = json.loads((wd / "truth.json").read_text())[cell]
    cdir = wd / "results" / "replay" / cell
    rng = random.Random()
    for step in (r for r in RUNGS if r <= until):
        if cell == FAIL_CELL and step > FAIL_STEP:
            atomic_json(cdir / "summary.json", {"cell": cell, "config_hash": config_hash, "state": "diverged",
                                                "diverged_at_step": FAIL_STEP, "diverged_reason": "loss nan"})
            return
        path = cdir / "eval" / f"synthetic@{step}.json"
        if path.exists():
            continue
        time.sleep(rng.uniform(0.05, 0.25))  # training to the rung, then its evaluation
        v = values[str(step)]
        atomic_json(path, {"benchmark": "synthetic", "step": step, "primary_metric": "pass@1",
                           "metrics": {"pass@1": {"name": "pass@1", "value": v, "ci_low": v, "ci_high": v,
                                                  "n_problems": 8}},
                           "meta": {"study": "replay", "cell": cell, "config_hash": config_hash,
                                    "target": f"synthetic@{step}"}})


def terminal(ledger: dict | None) -> bool:
    return bool(ledger) and all(s["state"] in ("stopped", "failed", "finishing") for s in ledger["state"].values())


def controller(wd: Path) -> None:
    """The decision loop: decide from the records now on disk and write the ledger, until the end."""
    from lorarl.adaptive.ledger import update_search
    from lorarl.language.study import cell_table, load_study

    study = load_study(wd / "study.yaml")
    table = cell_table(study)
    done = terminal(update_search(study, table, wd / "results"))
    (wd / f"controller-{os.getpid()}").touch()  # the driver counts the kills that land in the loop
    while not done:
        done = terminal(update_search(study, table, wd / "results"))
        time.sleep(0.001)


def spawn(wd: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, __file__, "--workdir", str(wd), *args], env=env)
    proc.start = time.monotonic()  # type: ignore[attr-defined]
    return proc


def controller_kill(rng: random.Random) -> tuple[str, float]:
    """When the next controller dies if it is the target: while starting (1 in 5, 0-2 s after its start),
    else 0-300 ms after it entered its decision loop (reading records or writing the ledger)."""
    return ("starting", rng.uniform(0.0, 2.0)) if rng.random() < 0.2 else ("deciding", rng.uniform(0.0, 0.3))


def replay(wd: Path, rule: str, kills: int, rng: random.Random) -> dict:
    """Run the study to its end, spending at most ``kills`` SIGKILLs; the final ledger and what was killed."""
    from lorarl.adaptive.ledger import cell_plan, read, search_path
    from lorarl.language.study import cell_table, load_study

    study = {**STUDY, "search": {"rule": rule, "rungs": RUNGS, "eta": 3}}
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "study.yaml").write_text(json.dumps(study))
    table = cell_table(load_study(wd / "study.yaml"))
    cells = {c.id: c for c in table.cells}
    (wd / "truth.json").write_text(json.dumps(truth(list(cells))))
    steps = {c: 60 for c in cells}
    ctl, plan_kill = spawn(wd, "--role", "controller"), controller_kill(rng)
    up_since = None  # when this controller was first seen in its decision loop
    jobs: dict[str, subprocess.Popen] = {}
    killed = {"controller": 0, "controller in its loop": 0, "job": 0}
    restarts, launched = 0, 0
    next_kill, target = time.monotonic() + rng.uniform(0.05, 0.5), rng.choice(["controller", "job"])
    while True:
        for c in [c for c, p in jobs.items() if p.poll() is not None]:
            del jobs[c]
        if ctl.poll() is not None:
            if ctl.returncode == 0 and not jobs:
                break
            if ctl.returncode != 0:
                ctl, plan_kill, up_since = spawn(wd, "--role", "controller"), controller_kill(rng), None
                restarts += 1
        ledger = read(search_path(wd / "results", "replay"))
        if ledger:
            for cid, p in cell_plan(ledger, steps).items():
                need = p["state"] == "running" and not (wd / "results/replay" / cid / "eval" /
                                                        f"synthetic@{p['until']}.json").exists()
                failed = (wd / "results/replay" / cid / "summary.json").exists()
                if need and not failed and cid not in jobs:
                    jobs[cid] = spawn(wd, "--role", "job", "--cell", cid, "--hash", cells[cid].hash,
                                      "--until", str(p["until"]))
                    launched += 1
        now = time.monotonic()
        if up_since is None and (wd / f"controller-{ctl.pid}").exists():
            up_since = now
        if target == "controller":  # 1 in 5 while it starts, the others 0-300 ms into its decision loop
            when, delay = plan_kill
            due = ctl.start + delay if when == "starting" else (up_since + delay if up_since else math.inf)
            victims = [ctl] if ctl.poll() is None and now >= max(next_kill, due) else []
        else:  # a job kill waits for a running job
            victims = [p for p in jobs.values() if p.poll() is None] if now >= next_kill else []
        if kills and victims:
            proc = rng.choice(victims)
            in_loop = (wd / f"controller-{proc.pid}").exists()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed[target] += 1
            killed["controller in its loop"] += target == "controller" and in_loop
            kills -= 1
            next_kill, target = now + rng.uniform(0.05, 0.5), rng.choice(["controller", "job"])
        time.sleep(0.002)
    strays = len(list((wd / "results").rglob("*.tmp")))
    return {"ledger": read(search_path(wd / "results", "replay")), "killed": killed, "restarts": restarts,
            "jobs": launched, "strays": strays}


def decisions(ledger: dict) -> set[tuple]:
    return {(d["setting"], d["rung"], d["decision"]) for d in ledger["decisions"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=100, help="SIGKILLs per rule (over as many killed replays as it takes)")
    ap.add_argument("--rules", default="sha,asha")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="default: a temporary folder")
    ap.add_argument("--role", choices=["driver", "controller", "job"], default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    ap.add_argument("--hash", help=argparse.SUPPRESS)
    ap.add_argument("--until", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "job":
        return job(Path(args.workdir), args.cell, args.hash, args.until)
    if args.role == "controller":
        return controller(Path(args.workdir))
    from lorarl.adaptive.ledger import render

    root = Path(args.workdir or tempfile.mkdtemp(prefix="lorarl-replay-"))
    if not args.workdir:  # a temporary folder goes when the bench ends
        atexit.register(shutil.rmtree, root, True)
    rng = random.Random(args.seed)
    print("| rule | run | SIGKILLs: controller (in its decision loop) / jobs | controller restarts | jobs started "
          "| stray temp files | decisions | differences from the uninterrupted run | same ledger bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    total, spent_all = 0, 0
    for rule in args.rules.split(","):
        t0 = time.perf_counter()
        clean = replay(root / f"{rule}-clean", rule, 0, rng)
        runs, spent = [("uninterrupted", clean)], 0
        while spent < args.kills:  # killed replays, each a whole study, until the kills are spent
            r = replay(root / f"{rule}-killed-{len(runs)}", rule, args.kills - spent, rng)
            spent += r["killed"]["controller"] + r["killed"]["job"]
            runs.append((f"killed #{len(runs)}", r))
        spent_all += spent
        want = decisions(clean["ledger"])
        for name, r in runs:
            diff = len(want ^ decisions(r["ledger"]))
            total += diff
            same = render(r["ledger"]) == render(clean["ledger"])
            k = r["killed"]
            print(f"| {rule} | {name} | {k['controller']} ({k['controller in its loop']}) / {k['job']} | "
                  f"{r['restarts']} | {r['jobs']} | {r['strays']} | {len(decisions(r['ledger']))} | {diff} | "
                  f"{'yes' if same else 'NO'} |")
        print(f"<!-- {rule}: {time.perf_counter() - t0:.0f} s -->")
    print(f"\nSIGKILLs: {spent_all}; decision differences from the uninterrupted runs: {total} (files under {root})")
    if total:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
