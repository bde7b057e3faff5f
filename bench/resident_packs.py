"""Resident packs against fixed packs and solo jobs: 16 cells of unequal lengths, side by side, one run.

    python bench/resident_packs.py                      # both scenarios, hosts driven in this process
    python bench/resident_packs.py --jobs               # ... and each way again as job processes (start-up counted)
    python bench/resident_packs.py --scenario collapse --seeds 2 --short 3 --long 8   # a quick look
    python bench/resident_packs.py --hidden 1024 --layers 8 --seeds 2   # a wider model (on a GPU: its own device)
    python bench/resident_packs.py --scenario lengths --seeds 2 --short 4 --long 12 --places 4  # hand-over vs edge

Two studies of 16 LoRA cells (8 seeds x 2) on a tiny local model (default: the tests' own, hidden 32, 2 layers),
P = 2 prompts x G = 2 completions of 8 tokens, K = 4:

* ``lengths``: half the cells 20 steps, half 60 (in study order short, long, short, ...). The fixed packs are the
  cells in packs of 4 in study order, formed WITHOUT ``train.steps`` in the key (each holds two short and two long
  cells and ends with its longest): what a pack whose lengths were unknown when it was planned does. lorarl's own
  planner keys fixed packs by ``train.steps`` (:func:`lorarl.pack.plan.plan_packs`) and would pack these lengths
  apart, without idle places; the next scenario is the one it cannot plan around.
* ``collapse``: every cell 60 steps; half of them (``train.stop_on_collapse: true``) are stopped by a collapse flag
  at step 20: the flag rules (:data:`lorarl.train.flags.RULES`) are replaced by one that fires at step 20 of every
  cell, as the tests do (the real rules would fire at step 3 here: an untrained tiny model's 8-token completions are
  all truncated); the stop, the freed place and the refill are lorarl's own. The fixed packs are lorarl's own plan
  (:func:`lorarl.pack.plan.plan_packs`, K = 4, study order): each holds two cells that stop at 20.

Three ways per scenario, each into its own results folder: solo (each cell a one-cell pack,
:func:`lorarl.pack.run.train_alone`), fixed packs (:func:`lorarl.pack.run.train_pack`), one resident job with K
places (:func:`lorarl.pack.resident.train_resident`). Driven in this process, the scheduling alone is measured.
``--jobs``: each way again as the jobs a Snakemake run starts, one process per job, one after another (as on one
GPU): 16 solo jobs, one per fixed pack, one resident job; the job start-up (imports, model load, tracking) is then
counted once per job. Every cell's metrics (all but wall-clock columns) and final adapter are checked equal to its
solo run (1e-6). Per packed way, when each member's outputs could be evaluated, side by side: under a DAG edge
from its pack job (the job's end) and under the hand-over (lorarl.pack.handover: when the member was staged).
Rewards: a deterministic score of the completion's text (tests/train/test_grpo.py's), since an untrained
tiny model is never right. One torch thread. Wall time, CPU seconds and pack-steps per way; ratios within this run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

NOISY = ("time/", "pack/", "tokens_per_s", "step_time")  # wall-clock and pack size: not part of a cell's result
WAYS = ("solo", "fixed", "resident")


def text_score(completions, answers=None):
    """A deterministic, non-degenerate grade of a completion's text (the tests' fake_score)."""
    return [float(sum(map(ord, c)) % 5) / 4 for c in completions]


def save_tiny(d: Path, hidden: int = 32, layers: int = 2) -> str:
    """The tests' tiny model and tokenizer (tests/support/tiny_model.py), or a wider one, saved in ``d``."""
    import torch

    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    heads = max(2, hidden // 16 if hidden <= 64 else hidden // 64)
    model = build_tiny(TinyRecipe(hidden=hidden, layers=layers, heads=heads, kv_heads=max(1, heads // 2),
                                  intermediate=2 * hidden), len(tok), tok.eos_token_id, tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def write_study(root: Path, model: str, scenario: str, short: int, long: int, seeds: int) -> Path:
    train = {"prompts_per_step": 2, "generations": 2, "max_completion_length": 8, "lr": 1e-2, "checkpoint_every": 0,
             "kl_monitor_every": 0}
    axes = {"seed": {"field": "seed", "prefix": "s", "values": list(range(seeds))}}
    if scenario == "lengths":
        axes["length"] = {"field": "train.steps", "prefix": "n", "values": [short, long]}
    else:
        train["steps"] = long
        axes["stop"] = {"field": "train.stop_on_collapse", "prefix": "c", "values": [False, True]}
    doc = {"name": "rb", "defaults": {
        "model": model, "task": {"name": "synthetic", "seed": 7, "n_train": 24, "n_eval": 4, "max_value": 9},
        "adapter": {"method": "lora", "rank": 2, "alpha": 4, "dropout": 0.0}, "train": train}, "axes": axes}
    p = root / f"rb-{scenario}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def study_cells(path: Path) -> list:
    """The study's cells: per seed, the short (or never-stopped) cell, then the long (or collapsing) one."""
    from lorarl.language.study import cell_table, load_study

    cells = list(cell_table(load_study(str(path))).cells)
    return sorted(cells, key=lambda c: (c.config.seed, c.config.train.steps, c.config.train.stop_on_collapse))


def fixed_packs(cells: list, scenario: str, K: int) -> list[list]:
    """Fixed packs: study order, K at a time (lengths); lorarl's own plan (collapse)."""
    if scenario == "lengths":
        return [cells[i:i + K] for i in range(0, len(cells), K)]
    from lorarl.pack.plan import plan_packs

    by = {c.id: c for c in cells}
    return [[by[i] for i in p] for p in plan_packs(cells, K)]


def patch(scenario: str, short: int) -> None:
    """Outcome cells graded by :func:`text_score`; in the collapse scenario, a flag that fires at step ``short``."""
    from lorarl.pack import build
    from lorarl.rewards.outcome import OutcomeDeposits

    real = build.build_pack

    def build_pack(*a, **kw):
        pack = real(*a, **kw)
        for m in pack.loop.members:
            if isinstance(m.regime, OutcomeDeposits):
                m.regime = OutcomeDeposits(score_fn=text_score)
        return pack

    build.build_pack = build_pack
    if scenario == "collapse":
        from lorarl.train import flags

        flags.RULES.clear()  # the flags' own rules would fire on this untrained model's truncated completions
        flags.RULES["bench_collapse"] = _FiresAt(short)


class _FiresAt:
    """A collapse flag rule that fires at step ``n`` of every cell (only stop_on_collapse cells stop there)."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, rows) -> int | None:
        return self.n if len(list(rows)) >= self.n else None


def run_way(way: str, cells: list, scenario: str, K: int, out: Path) -> dict[str, float]:
    """One way over these cells, in this process. Returns, per cell, when its job ended (s from the start): when a
    DAG edge from the job (its `pack_done`) would let the cell's train job, and then its evaluation, start."""
    from lorarl.pack.plan import pack_id
    from lorarl.pack.resident import train_resident
    from lorarl.pack.run import train_alone, train_pack

    t0, ends = time.perf_counter(), {}
    if way == "solo":
        for c in cells:
            train_alone("rb", c, out, threads=1)
            ends[c.id] = time.perf_counter() - t0
    elif way == "fixed":
        for p in fixed_packs(cells, scenario, K):
            train_pack("rb", p, out, threads=1, pack_id=pack_id([c.id for c in p]))
            ends.update({c.id: time.perf_counter() - t0 for c in p})
    else:
        train_resident("rb", cells, out, places=K, threads=1, resident_id="pack-resident")
        ends.update({c.id: time.perf_counter() - t0 for c in cells})
    return ends


STAGED_AT: dict[str, float] = {}  # cell dir -> when a pack staged its outputs (time.perf_counter())


def watch_staging() -> None:
    """Record when each member's outputs are staged (lorarl.pack.handover.stage, which the pack's cell runs call):
    under the hand-over the member's train job publishes them then, and its evaluation can start (the publish is a
    few renames)."""
    from lorarl.pack import handover

    real = handover.stage

    def stage(work, cell_dir):
        out = real(work, cell_dir)
        STAGED_AT[Path(cell_dir).name] = time.perf_counter()
        return out

    handover.stage = stage


def evaluable(cells: list, ends: dict[str, float], staged: dict[str, float]) -> dict:
    """When each member's outputs could be evaluated (s from the way's start): under a DAG edge from its pack job
    (the job's end) and under the hand-over (its staging), side by side."""
    rows = {c.id: {"edge_s": round(ends[c.id], 2), "handover_s": round(staged[c.id], 2)} for c in cells}
    edge = sum(r["edge_s"] for r in rows.values()) / len(rows)
    hand = sum(r["handover_s"] for r in rows.values()) / len(rows)
    return {"cells": rows, "mean_edge_s": round(edge, 2), "mean_handover_s": round(hand, 2),
            "mean_edge/handover": round(edge / hand, 3) if hand else None,
            "max_wait_s": round(max(r["edge_s"] - r["handover_s"] for r in rows.values()), 2)}


def timed(fn) -> dict:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return {"wall_s": round(time.perf_counter() - w, 2), "cpu_s": round(time.process_time() - c, 2)}


def job_commands(way: str, cells: list, scenario: str, K: int) -> list[list[str]]:
    """The jobs of one way: (cell ids of each job)."""
    if way == "solo":
        return [[c.id] for c in cells]
    if way == "fixed":
        return [[c.id for c in p] for p in fixed_packs(cells, scenario, K)]
    return [[c.id for c in cells]]


def timed_jobs(way: str, cells: list, args, name: str, study: Path, out: Path) -> dict:
    """Each job of ``way`` in scenario ``name`` as its own process, one after another: wall and the children's CPU
    seconds."""
    jobs = job_commands(way, cells, name, args.places)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    for ids in jobs:
        cmd = [sys.executable, __file__, "--child", way, "--study", str(study), "--out", str(out),
               "--ids", ",".join(ids), "--scenario", name, "--short", str(args.short),
               "--places", str(args.places)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(time.perf_counter() - w, 2), "cpu_s": round(cpu, 2), "jobs": len(jobs)}


def child(args) -> None:
    """One job: ``way`` over the listed cells of the study, in this process."""
    import torch

    torch.set_num_threads(1)
    patch(args.scenario, args.short)
    by = {c.id: c for c in study_cells(Path(args.study))}
    run_way(args.child, [by[i] for i in args.ids.split(",")], args.scenario, args.places, Path(args.out))


def outputs(folder: Path) -> tuple:
    import pandas as pd
    from safetensors.torch import load_file

    rows = pd.read_csv(folder / "metrics.csv")
    rows = rows[[c for c in rows.columns if not c.startswith(NOISY)]]
    return load_file(str(folder / "adapter" / "adapter_model.safetensors")), rows


def cell_folder(got: Path, cid: str, staged: bool) -> Path:
    return got / "rb" / cid / (".packed" if staged else "")


def pack_steps(cells: list, got: Path, staged: bool) -> float:
    """Steps the jobs' packs took (each member's row at a step carries ``pack/cells``, the members that took it): the
    device time where a step costs the same however many of its places are filled (an under-filled GPU)."""
    import pandas as pd

    total = 0.0
    for c in cells:
        rows = pd.read_csv(cell_folder(got, c.id, staged) / "metrics.csv")
        total += float((1.0 / rows["pack/cells"]).sum())
    return round(total, 1)


def differences(cells: list, got: Path, want: Path, staged: bool) -> float:
    """The largest difference of any cell's metrics and adapter from its solo run's (inf: columns/steps differ)."""
    worst = 0.0
    for c in cells:
        w, m = outputs(cell_folder(got, c.id, staged))
        w0, m0 = outputs(cell_folder(want, c.id, False))
        if list(m.columns) != list(m0.columns) or len(m) != len(m0) or w.keys() != w0.keys():
            return float("inf")
        dm = float(abs(m.to_numpy(dtype=float) - m0.to_numpy(dtype=float)).max())
        worst = max(worst, dm, max(float((w[k] - w0[k]).abs().max()) for k in w))
    return worst


def ratios(runs: dict) -> dict:
    r, f, s = runs["resident"], runs["fixed"], runs["solo"]
    out = {"resident/fixed wall": r["wall_s"] / f["wall_s"], "resident/solo wall": r["wall_s"] / s["wall_s"],
           "fixed/solo wall": f["wall_s"] / s["wall_s"], "resident/fixed cpu": r["cpu_s"] / f["cpu_s"]}
    if "pack_steps" in r:
        out["resident/fixed pack-steps"] = r["pack_steps"] / f["pack_steps"]
    return {k: round(v, 3) for k, v in out.items()}


def scenario(args, root: Path, model: str, name: str) -> dict:
    """One scenario: the three ways in process (and as jobs with ``--jobs``), checked against the solo runs."""
    from lorarl.train import flags

    rules = dict(flags.RULES)  # the collapse scenario replaces them for its run
    patch(name, args.short)
    watch_staging()
    study = write_study(root, model, name, args.short, args.long, args.seeds)
    cells = study_cells(study)
    K = args.places
    res = {"cells": len(cells), "in_process": {}, "jobs": {}}
    dirs = {w: root / name / w for w in WAYS}
    for w in WAYS:
        ends: dict[str, float] = {}
        STAGED_AT.clear()
        t0 = time.perf_counter()
        res["in_process"][w] = timed(lambda w=w: ends.update(run_way(w, cells, name, K, dirs[w])))
        res["in_process"][w]["pack_steps"] = pack_steps(cells, dirs[w], staged=w != "solo")
        if w != "solo":  # packed members: when their evaluations could start, DAG edge against hand-over
            res.setdefault("evaluable", {})[w] = evaluable(cells, ends, {k: v - t0 for k, v in STAGED_AT.items()})
    steps = {c.id: len(outputs(cell_folder(dirs["solo"], c.id, False))[1]) for c in cells}
    res["cell_steps"] = sum(steps.values())
    res["max_diff_from_solo"] = {w: differences(cells, dirs[w], dirs["solo"], staged=True) for w in ("fixed", "resident")}
    ledger = json.loads((dirs["resident"] / "rb" / ".packs" / "pack-resident.ledger.json").read_text())
    res["resident_segments"] = len(ledger["segments"])
    res["ratios_in_process"] = ratios(res["in_process"])
    if args.jobs:
        jdirs = {w: root / name / f"jobs-{w}" for w in WAYS}
        for w in WAYS:
            res["jobs"][w] = timed_jobs(w, cells, args, name, study, jdirs[w])
        res["max_diff_from_solo"].update({f"jobs {w}": differences(cells, jdirs[w], dirs["solo"], staged=w != "solo")
                                          for w in WAYS})
        res["ratios_jobs"] = ratios(res["jobs"])
    from lorarl.train import flags

    flags.RULES.clear()
    flags.RULES.update(rules)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=("lengths", "collapse", "both"), default="both")
    ap.add_argument("--short", type=int, default=20, help="steps of the short cells / the collapse step")
    ap.add_argument("--long", type=int, default=60, help="steps of the long cells (every cell's, collapse)")
    ap.add_argument("--seeds", type=int, default=8, help="seeds (cells = 2 x seeds)")
    ap.add_argument("--places", type=int, default=4, help="K: cells per fixed pack, places of the resident job")
    ap.add_argument("--jobs", action="store_true", help="also run each way as job processes (start-up counted)")
    ap.add_argument("--hidden", type=int, default=32, help="model width (32: the tests' tiny model)")
    ap.add_argument("--layers", type=int, default=2, help="model depth")
    ap.add_argument("--out", default="bench/results/resident_packs.json")
    ap.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)  # one job of --jobs
    ap.add_argument("--study", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    import torch

    torch.set_num_threads(1)
    load0 = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="resident-bench-"))
    names = ("lengths", "collapse") if args.scenario == "both" else (args.scenario,)
    try:
        model = save_tiny(root / "tiny", args.hidden, args.layers)
        results = {n: scenario(args, root, model, n) for n in names}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else \
        f"{platform.machine()} CPU, {os.cpu_count()} cores"
    worst = max(v for r in results.values() for v in r["max_diff_from_solo"].values())
    result = {"scenarios": results, "places": args.places, "short_steps": args.short, "long_steps": args.long,
              "model": {"hidden": args.hidden, "layers": args.layers}, "equal_to_solo": worst <= 1e-6,
              "largest_difference": worst, "machine": f"{dev}; torch {torch.__version__}, 1 thread",
              "target": "resident wall <= 0.75 x fixed packs' wall", "load_average_before": [round(x, 2) for x in load0]}
    for n, r in results.items():
        print(f"== {n}: {r['cells']} cells, {r['cell_steps']} cell-steps, K = {args.places}; resident job formed "
              f"{r['resident_segments']} packs")
        for w, t in r["in_process"].items():
            j = r["jobs"].get(w)
            print(f"{w:>9}: in process wall {t['wall_s']:7.1f} s cpu {t['cpu_s']:7.1f} s pack-steps {t['pack_steps']:6.1f}"
                  + (f" | as {j['jobs']:2d} jobs wall {j['wall_s']:7.1f} s cpu {j['cpu_s']:7.1f} s" if j else ""))
        for k, v in r["ratios_in_process"].items():
            print(f"  in process {k:>26}: {v:.3f}")
        for k, v in r.get("ratios_jobs", {}).items():
            print(f"  as jobs    {k:>26}: {v:.3f}")
        for w, ev in r.get("evaluable", {}).items():  # docs/packed.md: why the hand-over is not a DAG edge
            print(f"  {w} members' outputs evaluable (s from the start, in process): DAG edge | hand-over")
            for cid, row in ev["cells"].items():
                print(f"    {cid:>16}: {row['edge_s']:8.1f} | {row['handover_s']:8.1f}")
            print(f"    {'mean':>16}: {ev['mean_edge_s']:8.1f} | {ev['mean_handover_s']:8.1f}  "
                  f"(edge/hand-over {ev['mean_edge/handover']}, longest wait {ev['max_wait_s']:.1f} s)")
    print(f"every cell equal to its solo run (1e-6): {result['equal_to_solo']} (largest difference {worst:.2e})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    if not result["equal_to_solo"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
