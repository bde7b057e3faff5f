"""`lorarl memory <study> [--gpus N] [--nodes M]`: the plan as a table, one rank's GPU per row, then the evaluation
jobs' (lorarl.memory.evaluation); exit 0 every cell and evaluation fits, 1 one does not, 2 bad input."""

from __future__ import annotations

import sys
from typing import Any

from lorarl.memory.cells import CellPlan

COLUMNS = ["cell", "cells", "model", "method", "ranks", "strategy", "rows/update", "rows/rank", "tokens", "micro",
           "max micro", "max tokens", "ckpt", "gen chunk", "max gen", "peak GiB/GPU", "2nd GPU GiB", "fits"]


def add_arguments(me: Any) -> None:
    """The options of `lorarl memory` (lorarl.cli builds the subcommand)."""
    me.add_argument("study")
    me.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU in GiB (H100: 80, H200: 141)")
    me.add_argument("--gpus", type=int, default=None, help="GPUs per node of a training job (one rank each; a "
                    "teacher/PRM cell on one node of 2: one rank, teacher/PRM on the second); default: --profile's "
                    "slurm.train.gpus_per_node, else 1")
    me.add_argument("--nodes", type=int, default=None, help="nodes per training job; default: --profile's "
                    "slurm.train.nodes, else 1")
    me.add_argument("--profile", default=None, help="Snakemake profile the study runs with (default, slurm or a folder)")
    me.add_argument("--cell", default=None, help="plan this cell only")
    me.add_argument("--results", default="results", help="where built local models are (their config.json)")
    me.add_argument("--verbose", action="store_true", help="every part of every row's peak")


def _row(p: CellPlan) -> list[str]:
    return [p.cell, str(p.cells), p.model.split("/")[-1], p.method, str(p.ranks), p.strategy, str(p.rows),
            str(p.rank_rows), str(p.seq),
            str(p.micro_batch or "-"), str(p.max_micro_batch), str(p.max_micro_tokens or "-"), "on" if p.checkpointing else "off",
            str(p.generation_batch or "-"), str(p.max_generation_batch), f"{p.peak_gb:.1f}",
            f"{p.aux_gpu_gb:.1f}" if p.aux_gpu_gb else "-", "yes" if p.fits else "NO"]


def table(plans: list[CellPlan]) -> str:
    rows = [COLUMNS] + [_row(p) for p in plans]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def print_plan(plans: list[CellPlan], gpu_memory_gb: float, gpus: int, verbose: bool, out: Any = None,
               nodes: int = 1) -> int:
    out = out or sys.stdout
    if not plans:
        print("no cell of this study trains a model (the toy study computes on the CPU): nothing to plan", file=out)
        return 0
    print(f"memory plan: {nodes} node(s) x {gpus} GPU(s) of {gpu_memory_gb:g} GiB per training job, 10% headroom "
          f"(budget {0.9 * gpu_memory_gb:.1f} GiB); one row per distinct cell shape; peak, micro-batch and "
          f"generation chunk are one rank's (its share of the batch; ddp: a full replica, fsdp2: weights, "
          f"gradients and optimiser states sharded over the ranks)", file=out)
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
    if args.gpus is None or args.nodes is None:  # the profile's train jobs (the local launcher: 1 x 1)
        from lorarl.language.profiles import read_profile

        train = (read_profile(args.profile)["slurm"].get("train") or {}) if args.profile else {}
        for flag, key in (("gpus", "gpus_per_node"), ("nodes", "nodes")):
            if getattr(args, flag) is None:
                try:
                    setattr(args, flag, int(train.get(key) or 1))
                except (TypeError, ValueError):
                    print(f"error: the profile's slurm.train.{key} must be a whole number >= 1; got "
                          f"{train.get(key)!r}", file=sys.stderr)
                    return 2
    for flag, key in (("gpus", "gpus_per_node"), ("nodes", "nodes")):
        if getattr(args, flag) < 1:
            print(f"error: --{flag} must be a whole number >= 1 (the profile's slurm.train.{key}); got "
                  f"{getattr(args, flag)}", file=sys.stderr)
            return 2
    from lorarl.memory.evaluation import plan_study_eval, print_eval_plan

    try:
        plans = plan_study(args.study, args.gpu_memory_gb, args.gpus, args.cell, args.results, nodes=args.nodes)
        evals = plan_study_eval(args.study, args.gpu_memory_gb, args.cell, args.results)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    code = print_plan(plans, args.gpu_memory_gb, args.gpus, args.verbose, nodes=args.nodes)
    return max(code, print_eval_plan(evals, args.gpu_memory_gb, sys.stdout))  # the evaluation jobs' KV cache too
