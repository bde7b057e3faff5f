"""`lorarl memory <study>`: the plan as a table; exit 0 every cell fits, 1 one does not, 2 bad input."""

from __future__ import annotations

import sys
from typing import Any

from lorarl.memory.cells import CellPlan

COLUMNS = ["cell", "cells", "model", "method", "rows/update", "tokens", "micro", "max micro", "ckpt", "gen chunk",
           "max gen", "peak GiB", "2nd GPU GiB", "fits"]


def _row(p: CellPlan) -> list[str]:
    return [p.cell, str(p.cells), p.model.split("/")[-1], p.method, str(p.rows), str(p.seq),
            str(p.micro_batch or "-"), str(p.max_micro_batch), "on" if p.checkpointing else "off",
            str(p.generation_batch or "-"), str(p.max_generation_batch), f"{p.peak_gb:.1f}",
            f"{p.aux_gpu_gb:.1f}" if p.aux_gpu_gb else "-", "yes" if p.fits else "NO"]


def table(plans: list[CellPlan]) -> str:
    rows = [COLUMNS] + [_row(p) for p in plans]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def print_plan(plans: list[CellPlan], gpu_memory_gb: float, gpus: int, verbose: bool, out: Any = None) -> int:
    out = out or sys.stdout
    if not plans:
        print("no cell of this study trains a model (the toy study computes on the CPU): nothing to plan", file=out)
        return 0
    print(f"memory plan: {gpus} GPU(s) of {gpu_memory_gb:g} GiB per training job, 10% headroom "
          f"(budget {0.9 * gpu_memory_gb:.1f} GiB); one row per distinct cell shape", file=out)
    print(table(plans), file=out)
    for p in plans:
        if verbose or not p.fits:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in p.parts_gb.items() if k not in ("peak",))
            print(f"\n{p.cell}: {parts} (GiB)", file=out)
            for n in p.notes:
                print(f"  note: {n}", file=out)
        if not p.fits:
            print(f"  does not fit; fix: {'; '.join(p.knobs) or 'a GPU with more memory'}", file=out)
    bad = [p for p in plans if not p.fits]
    print(f"\n{len(plans) - len(bad)} of {len(plans)} cell shapes fit" +
          (f"; {len(bad)} do not (see above)" if bad else ""), file=out)
    return 1 if bad else 0


def cmd_memory(args: Any) -> int:
    from lorarl.memory.arch import PlanError
    from lorarl.memory.cells import plan_study

    if args.gpu_memory_gb <= 0:
        print(f"error: --gpu-memory-gb must be a positive number of GiB; got {args.gpu_memory_gb}", file=sys.stderr)
        return 2
    if args.gpus is None:  # the profile's train jobs: slurm.train.gpus_per_node (the local launcher: 1)
        from lorarl.pipeline.doctor_report import read_profile

        train = (read_profile(args.profile)["slurm"].get("train") or {}) if args.profile else {}
        args.gpus = min(int(train.get("gpus_per_node") or 1), 2)
    if args.gpus not in (1, 2):
        print(f"error: --gpus must be 1 or 2 (the profile's slurm.train.gpus_per_node); got {args.gpus}",
              file=sys.stderr)
        return 2
    try:
        plans = plan_study(args.study, args.gpu_memory_gb, args.gpus, args.cell, args.results)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return print_plan(plans, args.gpu_memory_gb, args.gpus, args.verbose)
