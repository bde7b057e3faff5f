"""`lorarl` command line: cells | run | launch | aggregate | report | base | rescore | status | doctor | memory |
tracking serve | sync-mlflow.

Light at import: heavy libraries load only inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lorarl.adaptive.hypotheses import robustness_note
from lorarl.language.kinds import KINDS, entry, get_kind
from lorarl.pipeline.jobs import jobparams
from lorarl.pipeline.jobs.stages import launchable
from lorarl.language.study import StudyError, cell_table, load_study, load_study_to_list, load_study_to_run


def cmd_cells(args: argparse.Namespace) -> int:
    """Lists the cells and runs nothing: a study this machine cannot run (a hub model or dataset neither cached nor
    reachable) is listed with what it cannot get; one the hub says does not exist is refused (exit 2)."""
    study, cannot = load_study_to_list(args.study)
    rc = _list_cells(args, study)
    out = sys.stderr if args.json or args.ids else sys.stdout  # machine-readable output keeps stdout to itself
    for line in cannot:
        print(f"cannot run here: {line}", file=out)
    if cannot:
        print(f"{len(cannot)} Hugging Face reference(s) this machine cannot get: `lorarl run`, `lorarl doctor` and "
              "Snakemake refuse the study here (docs/studies.md#models-and-datasets-checked-before-anything-runs)",
              file=out)
    return rc


def _list_cells(args: argparse.Namespace, study) -> int:
    table = cell_table(study)
    cells = table.cells
    axes = list(study.axes)
    if args.packs:
        from lorarl.pack.plan import plan_packs

        try:
            packs = plan_packs(cells, args.max_cells)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps([{"pack": i, "cells": p} for i, p in enumerate(packs)], indent=2))
            return 0
        for i, p in enumerate(packs):
            print(f"pack {i}: {' '.join(p)}")
        print(f"{len(packs)} packs for {len(cells)} cells (pack.max_cells = {args.max_cells}; "
              f"{sum(len(p) == 1 for p in packs)} solo)")
        return 0
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
    for name, h in study.hypotheses.items():  # what each hypothesis's claims rest on (bad seeds, skew)
        print(robustness_note(name, h))
    note = f" ({table.merged} identical cells merged)" if table.merged else ""
    print(f"{len(cells)} cells in study {study.name!r}{note}; base pseudo-cells: "
          f"{', '.join(table.base_ids) or 'none'}")
    return 0


def use_tracking(args: argparse.Namespace) -> None:
    """`--tracking` / `--tracking-credentials` (from the profile) into this process's environment, where
    lorarl.tracking.client and every job started from here read them; a bad value exits 2 before anything runs."""
    import os

    from lorarl.tracking.client import TRACKING_ENV, resolve_tracking
    from lorarl.tracking.credentials import CREDENTIALS_ENV, check_client

    creds = getattr(args, "tracking_credentials", None) or None
    if getattr(args, "tracking", None):
        uri = resolve_tracking(args.tracking, getattr(args, "results", "results"))  # TrackingError: exit 2
        if uri.startswith(("http://", "https://")):
            check_client(uri, creds)  # a readable-by-others or missing credentials file: exit 2, nothing submitted
        os.environ[TRACKING_ENV] = args.tracking
    if creds:
        os.environ[CREDENTIALS_ENV] = creds


def cmd_run(args: argparse.Namespace) -> int:
    """Run one cell directly (no Snakemake, no submitit): train then evaluate; for debugging."""
    from lorarl.pipeline.jobs.launch import run_stage

    allowed = launchable()  # the registry's: never the doctor's (`lorarl doctor` runs its own jobs), imported or not
    if bad := [s for s in args.stages.split(",") if s not in allowed]:  # before anything runs or is written
        sys.stderr.write(f"error: --stages {','.join(bad)}: not a stage `lorarl run` runs; allowed: {', '.join(allowed)}\n")
        return 2
    load_study_to_run(args.study)  # a model or dataset neither cached nor reachable: exit 2 before anything runs
    use_tracking(args)
    for stage in args.stages.split(","):
        out = run_stage(stage, args.study, args.cell, args.results, args.threads)
        print(json.dumps(out, indent=2, default=str))
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from lorarl.pipeline.jobs.launch import launch

    use_tracking(args)
    return launch(args.stage, args.study, args.cell, args.results, args.executor, args.threads,
                  json.loads(args.slurm) if args.slurm else None, jobparams.from_args(args))


def link_tracking(args: argparse.Namespace) -> None:
    """aggregate/report/status: the `tracking:` setting and `--mlflow-ui` only say where the MLflow links point
    (lorarl.report.mlflow_links); nothing is written to the store, so they are not validated here."""
    import os

    from lorarl.report.mlflow_links import UI_ENV
    from lorarl.tracking.client import TRACKING_ENV, TrackingError
    from lorarl.tracking.credentials import CREDENTIALS_ENV

    if args.mlflow_ui and not args.mlflow_ui.startswith(("http://", "https://")):  # exit 2, nothing written
        raise TrackingError(f"--mlflow-ui {args.mlflow_ui!r}: not an address; allowed: http(s)://host[:port] of "
                            "MLflow's UI (or empty: the tracking server, else `mlflow ui`'s default)")
    for value, env in ((args.tracking, TRACKING_ENV), (args.tracking_credentials, CREDENTIALS_ENV),
                       (args.mlflow_ui, UI_ENV)):
        if value:
            os.environ[env] = value


def cmd_aggregate(args: argparse.Namespace) -> int:
    from lorarl import ledger
    from lorarl.jobclock import process_age_s
    from lorarl.pipeline.studyrun.study_run import publish

    link_tracking(args)
    study = load_study(args.study)
    cost = Path(args.results) / study.name / ".aggregate" / ledger.DIR  # its own record (lorarl.ledger)
    with ledger.job(cost, "aggregate", in_process=False, process_age_s=process_age_s(), study=study.name,
                    cell="aggregate"):
        ledger.first_work()  # start-up ends here
        kind = get_kind(study.kind)
        entry(kind.aggregate)(study, args.results)  # tables (+ figures) of the kind (lorarl.language.kinds)
        if kind.report:
            from lorarl.report import build

            build(args.study, args.results, price=args.gpu_hour_price)  # stats, the papers' figures, cost, report.html
        publish(study, args.results, price=args.gpu_hour_price, invocation=args.invocation)  # the MLflow parent run
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Tables with intervals, the papers' figures and report.html, for a study at any stage."""
    from lorarl.report import build

    link_tracking(args)
    study = load_study(args.study)
    if not get_kind(study.kind).report:
        allowed = ", ".join(k.name for k in KINDS.values() if k.report)
        print(f"error: study kind {study.kind!r} has no report; allowed: {allowed}", file=sys.stderr)
        return 2
    print(build(args.study, args.results, price=args.gpu_hour_price)["report"])
    return 0


def cmd_rescore(args: argparse.Namespace) -> int:
    """Grade stored evaluation samples again (no generation) and rewrite their summaries."""
    from lorarl.evaluate.main import rescore_cell, rescore_file

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


def cmd_sync_mlflow(args: argparse.Namespace) -> int:
    from lorarl.pipeline.studyrun.sync import sync_study

    use_tracking(args)
    report = sync_study(args.study, args.results)
    for row in report:
        print(f"{row['cell']}: run {row['run_id']} ({row['run']}); {row['logged']} value(s) logged, "
              f"{row['present']} already there")
    print(f"{len(report)} cell(s) synced into {report[0]['uri'] if report else 'the store'}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Each cell: done / running (job, step x/N) / queued / failed (state + reason) / not started."""
    from lorarl.language.hubcheck import early_probe
    from lorarl.status import as_json, format_table, status_notes, study_status

    if args.watch:
        from lorarl.pipeline.progress.watch import watch

        load_study(args.study)  # a bad study: exit 2 before the first redraw
        return watch(args.study, args.results, args.interval, args.max_updates)
    probe = None if args.json else early_probe()  # asks the hub while the study loads (its notes)
    rows = study_status(args.study, args.results)
    if args.json:
        print(json.dumps(as_json(rows), indent=2))
        return 0
    from lorarl.report.mlflow_links import text_line, ui_target

    study = load_study(args.study)
    link_tracking(args)
    link = text_line(ui_target(args.results, study.name), study.name)  # the study's runs table in MLflow's UI
    # the study's MLflow link, what its jobs cost so far and projected (lorarl.report.cost), then the notes
    from lorarl.report.cost import status_line

    print(format_table(rows, [link, status_line(study, args.results), *status_notes(study, rows, args.results, probe)]))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Smoke-test one cell on the study's launcher/profile; report and project the study's cost."""
    from lorarl.pipeline.doctor.report import run_doctor

    return run_doctor(args.study, args.cell, args.steps, args.profile, args.results, args.eval_limit, args.threads,
                      args.config)


def cmd_memory(args: argparse.Namespace) -> int:
    """Projected peak memory of every cell shape of a study; what fits (lorarl.memory)."""
    from lorarl.memory.report import cmd_memory as run

    return run(args)


def _tracking_args(p: argparse.ArgumentParser, links: bool = False) -> None:
    p.add_argument("--tracking", default=None, help="MLflow store: sqlite | http(s)://host:port (the profile's)")
    p.add_argument("--tracking-credentials", default=None, help="credentials file of a server with auth (a path)")
    if links:
        p.add_argument("--mlflow-ui", default=None, help="address of MLflow's UI for the links (the profile's "
                       "mlflow_ui; default: the tracking server, or `mlflow ui`'s over sqlite)")


def _price_arg(p: argparse.ArgumentParser) -> None:
    def gpu_hour_price(text: str) -> float | None:  # lorarl.report.cost (pandas) imported only when it is given
        from lorarl.report.cost import parse_price
        return parse_price(text)

    p.add_argument("--gpu-hour-price", type=gpu_hour_price, default=None, help="price per GPU-hour for the cost "
                   "section and tables/cost.csv's cost column (the profile's gpu_hour_price; default none: hours only)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lorarl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("cells", help="print the expanded matrix of a study")
    c.add_argument("study")
    c.add_argument("--ids", action="store_true", help="cell ids only, one per line")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--packs", action="store_true", help="show how the cells group into packs (lorarl.pack)")
    c.add_argument("--max-cells", type=int, default=4, help="--packs: most cells per pack (1 = no packing)")
    c.set_defaults(fn=cmd_cells)

    r = sub.add_parser("run", help="run one cell in this process (debugging)")
    r.add_argument("study")
    r.add_argument("cell")
    r.add_argument("--stages", default="train,evaluate",
                   help=f"comma list of stages, run in order (of: {', '.join(launchable())})")
    r.add_argument("--results", default="results")
    r.add_argument("--threads", type=int, default=None)
    _tracking_args(r)
    r.set_defaults(fn=cmd_run)

    la = sub.add_parser("launch", help="submit one stage of one cell through submitit and wait")
    la.add_argument("stage", choices=launchable(), help="a registered stage (lorarl.pipeline.jobs.stages)")
    la.add_argument("study", help="study YAML (for `base`: ignored)")
    la.add_argument("cell", help="cell id (for `base`: the local model recipe)")
    la.add_argument("--results", default="results")
    la.add_argument("--executor", default="local", choices=["debug", "local", "slurm"])
    la.add_argument("--threads", type=int, default=1)
    la.add_argument("--slurm", default=None, help="JSON of submitit Slurm parameters (from the profile)")
    jobparams.add_arguments(la)  # the job's parameters: --attempt, --until, --places, ... (lorarl.pipeline.jobs.jobparams)
    _tracking_args(la)
    la.set_defaults(fn=cmd_launch)

    a = sub.add_parser("aggregate", help="tables and figures of a study from the per-cell files")
    a.add_argument("study")
    a.add_argument("--results", default="results")
    _tracking_args(a, links=True)  # where report.html's MLflow links point (the aggregate rule passes the profile's)
    _price_arg(a)
    a.add_argument("--invocation", default=None,
                   help="the `snakemake` run of this aggregate (its rule passes it): times the study's last run")
    a.set_defaults(fn=cmd_aggregate)

    rp = sub.add_parser("report", help="write results/<study>/report.html (partial studies: what is done)")
    rp.add_argument("study")
    rp.add_argument("--results", default="results")
    _tracking_args(rp, links=True)  # where the MLflow links point (lorarl.report.mlflow_links)
    _price_arg(rp)
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
    _tracking_args(st, links=True)  # where its MLflow link points
    st.set_defaults(fn=cmd_status)

    tr = sub.add_parser("tracking", help="MLflow tracking server (see lorarl/tracking/server.py)")
    trs = tr.add_subparsers(dest="tracking_cmd", required=True)
    sv = trs.add_parser("serve", help="start mlflow server on PostgreSQL; print the URI for the profile")
    from lorarl.tracking.serve_command import add_arguments as serve_arguments, cmd_serve

    serve_arguments(sv)  # --host --port --profile --state --artifacts ... --slurm and its resources
    sv.set_defaults(fn=cmd_serve)

    sy = sub.add_parser("sync-mlflow", help="replay a study's files into the (new or repaired) MLflow store")
    sy.add_argument("study")
    sy.add_argument("--results", default="results")
    _tracking_args(sy)
    sy.set_defaults(fn=cmd_sync_mlflow)

    dr = sub.add_parser("doctor", help="smoke-test one cell where the study runs; project its time and GPU-hours")
    dr.add_argument("study")
    dr.add_argument("--cell", default=None, help="cell id (default: the first cell)")
    dr.add_argument("--steps", type=int, default=3, help="optimiser steps of the smoke run (the first is warm-up)")
    dr.add_argument("--profile", default=None, help="Snakemake profile the study runs with: default, slurm or a folder")
    dr.add_argument("--results", default="results")
    dr.add_argument("--eval-limit", type=int, default=8, help="problems per benchmark in the smoke evaluation")
    dr.add_argument("--threads", type=int, default=1, help="CPU threads of a local job (Slurm: the profile's)")
    dr.add_argument("--config", nargs="+", action="extend", default=None, metavar="KEY=VALUE", help="override the profile's "
                    "launcher/slurm/tracking/tracking_credentials as snakemake --config does (VALUE is YAML)")
    dr.set_defaults(fn=cmd_doctor)

    me = sub.add_parser("memory", help="projected peak GPU memory of each cell shape; the micro-batch and "
                        "generation chunk that fit (exit 1: a cell does not fit, naming the knob)")
    from lorarl.memory.report import add_arguments

    add_arguments(me)  # study, --gpu-memory-gb, --gpus, --nodes, --profile, --cell, --results, --verbose
    me.set_defaults(fn=cmd_memory)

    args = p.parse_args(argv)
    from lorarl.tracking.client import TrackingError, TrackingUnavailable

    try:
        return args.fn(args)
    except TrackingUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (TrackingError, StudyError, jobparams.JobParamError) as err:  # a pack job without --pack-id: nothing written
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
