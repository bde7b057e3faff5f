"""`lorarl` command line: cells | run | launch | aggregate | report | base | rescore | status | doctor.

Light at import: heavy libraries load only inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import sys

from lorarl.study import StudyError, cell_table, load_study


def cmd_cells(args: argparse.Namespace) -> int:
    study = load_study(args.study)
    table = cell_table(study)
    cells = table.cells
    axes = list(study.axes)
    if args.json:
        print(json.dumps([{"id": c.id, "hash": c.hash, "eval_hash": c.eval_hash, "axes": c.axes,
                           "aliases": list(c.aliases)} for c in cells], indent=2))
        return 0
    if args.ids:
        print("\n".join(c.id for c in cells))
        return 0
    rows = [["cell", *axes, "hash"]] + [[c.id, *(c.axes[a] for a in axes), c.hash] for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    for line in table.notes:  # "init does not apply to full: 2 cells merged into rfull-kl0-s0"
        print(line)
    note = f" ({table.merged} identical cells merged)" if table.merged else ""
    print(f"{len(cells)} cells in study {study.name!r}{note}; base pseudo-cells: "
          f"{', '.join(table.base_ids) or 'none'}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run one cell directly (no Snakemake, no submitit): train then evaluate; for debugging."""
    from lorarl.launch import run_stage

    for stage in args.stages.split(","):
        out = run_stage(stage, args.study, args.cell, args.results, args.threads)
        print(json.dumps(out, indent=2, default=str))
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from lorarl.launch import launch

    slurm = json.loads(args.slurm) if args.slurm else None
    return launch(args.stage, args.study, args.cell, args.results, args.executor, args.threads, slurm)


def cmd_aggregate(args: argparse.Namespace) -> int:
    study = load_study(args.study)
    if study.kind == "kl_bound_toy":
        from lorarl.toy.cells import aggregate_toy

        aggregate_toy(study, args.results)
    else:
        from lorarl.aggregate import aggregate
        from lorarl.report import build

        aggregate(study, args.results)
        build(args.study, args.results)  # stats tables, the papers' figures, report.html
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Tables with intervals, the papers' figures and report.html, for a study at any stage."""
    from lorarl.report import build

    study = load_study(args.study)
    if study.kind != "grpo":
        print(f"error: study kind {study.kind!r} has no report; allowed: grpo", file=sys.stderr)
        return 2
    out = build(args.study, args.results)
    print(out["report"])
    return 0


def cmd_rescore(args: argparse.Namespace) -> int:
    """Grade stored evaluation samples again (no generation) and rewrite their summaries."""
    from lorarl.evaluation import rescore_cell, rescore_file

    if args.target.endswith(".jsonl"):
        results = [rescore_file(args.target, timeout_s=args.timeout, write=not args.dry_run)]
    else:
        study = load_study(args.target)
        table = cell_table(study)
        ids = args.cells or table.ids + sorted(table.base_ids)
        results = []
        for cid in ids:
            cell = table.cell(cid)
            results += rescore_cell(study.name, cell, args.results, table.is_base(cell.id),
                                    timeout_s=args.timeout, write=not args.dry_run)
    changed = flipped = 0
    for r in results:
        new, old = r["new"]["metrics"], r["old"]["metrics"]
        nums = ", ".join(f"{k} {old[k]['value']:.4f}" + (f" -> {new[k]['value']:.4f}" if k in r["metrics_changed"]
                                                          else "") for k in old if k in new)
        flips = r["verdicts_changed"]
        state = ("identical" if r["identical"] and not flips
                 else "CHANGED" if r["metrics_changed"] else "same metrics")
        changed += bool(r["metrics_changed"])
        flipped += len(flips)
        print(f"{r['file']}: {state}: {nums}" + (f"; {len(flips)} verdict(s) changed" if flips else ""))
        for f in flips[:args.show]:
            print(f"  {f['problem_id']}#{f['sample']}: {'right' if f['correct_before'] else 'wrong'} -> "
                  f"{'right' if f['correct_after'] else 'wrong'}  gold {f['gold']!r}  graded "
                  f"{f['extracted_before']!r} -> {f['extracted_after']!r}")
        if len(flips) > args.show:
            print(f"  ... {len(flips) - args.show} more" + ("" if args.dry_run else " (all in eval/rescore/)"))
    verb = "would change" if args.dry_run else "changed"
    print(f"{len(results)} evaluation(s) re-scored; {changed} {verb}; {flipped} sample verdict(s) {verb}")
    return 1 if args.check and (changed or flipped) else 0


def cmd_status(args: argparse.Namespace) -> int:
    """Each cell: done / running (job, step x/N) / queued / failed (state + reason) / not started."""
    from lorarl.status import as_json, format_table, study_status

    if args.watch:
        from lorarl.watch import watch

        load_study(args.study)  # a bad study: exit 2 before the first redraw
        return watch(args.study, args.results, args.interval, args.max_updates)
    rows = study_status(args.study, args.results)
    print(json.dumps(as_json(rows), indent=2) if args.json else format_table(rows))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Smoke-test one cell on the study's launcher/profile; report and project the study's cost."""
    from lorarl.doctor_report import run_doctor

    return run_doctor(args.study, args.cell, args.steps, args.profile, args.results, args.eval_limit, args.threads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lorarl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("cells", help="print the expanded matrix of a study")
    c.add_argument("study")
    c.add_argument("--ids", action="store_true", help="cell ids only, one per line")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(fn=cmd_cells)

    r = sub.add_parser("run", help="run one cell in this process (debugging)")
    r.add_argument("study")
    r.add_argument("cell")
    r.add_argument("--stages", default="train,evaluate", help="comma list of train,evaluate")
    r.add_argument("--results", default="results")
    r.add_argument("--threads", type=int, default=None)
    r.set_defaults(fn=cmd_run)

    la = sub.add_parser("launch", help="submit one stage of one cell through submitit and wait")
    la.add_argument("stage", choices=["train", "evaluate", "base", "diagnose", "toy"])
    la.add_argument("study", help="study YAML (for `base`: ignored)")
    la.add_argument("cell", help="cell id (for `base`: the local model recipe)")
    la.add_argument("--results", default="results")
    la.add_argument("--executor", default="local", choices=["debug", "local", "slurm"])
    la.add_argument("--threads", type=int, default=1)
    la.add_argument("--slurm", default=None, help="JSON of submitit Slurm parameters (from the profile)")
    la.set_defaults(fn=cmd_launch)

    a = sub.add_parser("aggregate", help="tables and figures of a study from the per-cell files")
    a.add_argument("study")
    a.add_argument("--results", default="results")
    a.set_defaults(fn=cmd_aggregate)

    rp = sub.add_parser("report", help="write results/<study>/report.html (partial studies: what is done)")
    rp.add_argument("study")
    rp.add_argument("--results", default="results")
    rp.set_defaults(fn=cmd_report)

    rs = sub.add_parser("rescore", help="re-grade stored evaluation samples (no generation); rewrite summaries")
    rs.add_argument("target", help="a study YAML, or one <benchmark>[@step].jsonl file")
    rs.add_argument("cells", nargs="*", help="cell ids (default: every cell and base pseudo-cell)")
    rs.add_argument("--results", default="results")
    rs.add_argument("--timeout", type=float, default=None, help="math-verify seconds per sample (default: stored)")
    rs.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    rs.add_argument("--check", action="store_true", help="exit 1 if any metric or verdict changed")
    rs.add_argument("--show", type=int, default=20, help="changed verdicts printed per file (all are "
                    "recorded in <cell>/eval/rescore/<target>.jsonl)")
    rs.set_defaults(fn=cmd_rescore)

    st = sub.add_parser("status", help="where each cell stands: done/running/queued/failed (files + squeue/sacct)")
    st.add_argument("study")
    st.add_argument("--results", default="results")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--watch", action="store_true", help="compact view (counts, running steps, ETA), redrawn "
                    "until the study ends")
    st.add_argument("--interval", type=float, default=5.0, help="--watch: seconds between redraws")
    st.add_argument("--max-updates", type=int, default=None, help="--watch: stop after this many redraws")
    st.set_defaults(fn=cmd_status)

    dr = sub.add_parser("doctor", help="smoke-test one cell where the study runs; project its time and GPU-hours")
    dr.add_argument("study")
    dr.add_argument("--cell", default=None, help="cell id (default: the first cell)")
    dr.add_argument("--steps", type=int, default=3, help="optimiser steps of the smoke run (the first is warm-up)")
    dr.add_argument("--profile", default=None, help="Snakemake profile the study runs with: default, slurm or a folder")
    dr.add_argument("--results", default="results")
    dr.add_argument("--eval-limit", type=int, default=8, help="problems per benchmark in the smoke evaluation")
    dr.add_argument("--threads", type=int, default=1, help="CPU threads of a local job (Slurm: the profile's)")
    dr.set_defaults(fn=cmd_doctor)

    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except StudyError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
