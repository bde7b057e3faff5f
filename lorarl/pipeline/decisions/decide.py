"""The decision jobs of an adaptive study: the workflow's checkpoint rules run these (workflow/rules/adaptive.smk).

    python -m lorarl.pipeline.decisions.decide rung <study.yaml> --step 10 --n all --out <view> [--results R] [--tracking T]
    python -m lorarl.pipeline.decisions.decide look <study.yaml> --hypothesis NAME --n 4 --out <view> [--results R]

``rung``: decide from the records on disk and the previous ledger (lorarl.adaptive.ledger.update_search:
``results/<study>/adaptive/search.json``), then write the rung's **view** (its arrival order, the values used,
the decisions with their basis, the cells failed so far) atomically to ``--out``: the checkpoint's output that
the workflow's input functions read (lorarl.adaptive.flow). ``--n all`` must find the rung complete (every
setting recorded or failed), else exit 1 and write nothing. Then, best effort, the cells' MLflow runs get the
rung's metric (``adaptive/rung_value``, the cell's own, and ``adaptive/setting_rung_value``, its setting's mean,
at the rung's step) and, for a setting stopped or failed here, the tags ``lorarl.state=stopped`` (a cell that
failed keeps its ``diverged``), ``lorarl.stopped_at_step`` and ``lorarl.search`` (why); a stopped cell's run is
set FINISHED (censored, not failed).

``look``: the hypothesis's state after its first ``n`` seeds (lorarl.adaptive.hypotheses.hypothesis_state)
written to ``--out``, and the study's ``hypotheses.json`` rewritten from the records on disk.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.io import read_json, write_json

__all__ = ["rung_view", "look_view", "main"]


def rung_view(study_path: str, step: int, n: str, results: str, out: str | Path) -> dict:
    from lorarl.adaptive.ledger import update_search
    from lorarl.language.study import cell_table, load_study

    study = load_study(study_path)
    led = update_search(study, cell_table(study), results)
    rung = next((r for r in led["rungs"] if r["step"] == step), None)
    if rung is None:
        raise SystemExit(f"error: step {step} is not a rung of study {study.name} (rungs: "
                         f"{', '.join(str(r['step']) for r in led['rungs'])})")
    if n == "all" and not rung["complete"]:
        missing = [name for name in rung["arrival"] if name not in rung["decided"]]
        raise SystemExit(f"error: rung {step} of study {study.name} is not complete: no record yet of "
                         f"{', '.join(missing)}; nothing written")
    cells = {c for name in rung["arrival"] for c in led["settings"][name]["cells"]}
    view = {"study": study.name, "inputs_hash": led["inputs_hash"], "rule": led["rule"], "n": n,
            **{k: rung[k] for k in ("step", "complete", "keep", "arrival", "decided", "promoted", "values", "basis")},
            "failed": {c: s for c, s in led["failed"].items() if c in cells}}
    write_json(out, view)
    try:
        tag_runs(study.name, results, led, view)
    except Exception as err:  # noqa: BLE001 - the view is the record; MLflow is a view of it
        print(f"[lorarl] MLflow tags of rung {step}: {type(err).__name__}: {err}", file=sys.stderr)
    return view


def tag_runs(study: str, results: str, led: dict, view: dict) -> None:
    """The rung's metric on every cell's run; stopped (censored) and failed settings tagged, stopped runs ended."""
    from lorarl.tracking.client import Tracker

    step, tracker = view["step"], None
    for name in view["arrival"]:
        decision, value = view["decided"].get(name), view["values"].get(name)
        for cell in led["settings"][name]["cells"]:
            mark = read_json(paths.path("rung_mark", results=results, study=study, cell=cell, step=step)) or {}
            run_id = mark.get("mlflow_run_id")
            if not run_id:
                continue
            tracker = tracker or Tracker(results, study)
            tracker.run_id, tracker.logged, tracker.high_water = run_id, {}, -1  # this run's own marks
            row = {"step": step}
            if value is not None and cell in value.get("cells", {}):
                row.update({"adaptive/rung_value": value["cells"][cell], "adaptive/setting_rung_value": value["mean"]})
            logged = {m.step for m in tracker.client.get_metric_history(run_id, "adaptive/rung_value")}
            if len(row) > 1 and step not in logged:
                tracker.log_metrics([row])
            if decision in ("stop", "fail"):
                why = view["basis"].get(name, "")
                tags = {"lorarl.stopped_at_step": str(step),
                        "lorarl.search": f"{'stopped' if decision == 'stop' else 'setting failed'} at step {step}: {why}"}
                if cell not in view["failed"]:
                    tags["lorarl.state"] = "stopped"
                tracker.set_tags(tags)
                if cell not in view["failed"]:
                    tracker.finish("FINISHED")
            elif decision == "promote":
                tracker.set_tags({"lorarl.search": f"promoted at step {step}"})


def look_view(study_path: str, hypothesis: str, n: int, results: str, out: str | Path) -> dict:
    from lorarl.adaptive.hypotheses import hypothesis_state
    from lorarl.adaptive.ledger import hypothesis_observations, update_hypotheses
    from lorarl.language.adaptive.blocks import check_metric
    from lorarl.language.study import cell_table, load_study

    study = load_study(study_path)
    table = cell_table(study)
    h = study.hypotheses[hypothesis]
    metric = check_metric(table, h.metric, f"hypotheses.{hypothesis}.metric", "<study>", curve=False)
    obs = hypothesis_observations(study, table, results, h, metric, n=n)
    if len(obs) < n or any(d is None for _, d in obs):
        raise SystemExit(f"error: hypothesis {hypothesis}: look {n} lacks records of its first {n} seeds; nothing written")
    view = {"study": study.name, "hypothesis": hypothesis, "n": n, **hypothesis_state(h, obs),
            "observations": [{"seed": s, "difference": d} for s, d in obs]}
    write_json(out, view)
    update_hypotheses(study, table, results)
    return view


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lorarl.pipeline.decisions.decide", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["rung", "look"])
    ap.add_argument("study")
    ap.add_argument("--step", type=int, help="rung: its training step")
    ap.add_argument("--hypothesis", help="look: the hypothesis's name")
    ap.add_argument("--n", required=True, help="rung: settings of its arrival order, or all; look: seeds")
    ap.add_argument("--out", required=True, help="the view to write (the checkpoint's output)")
    ap.add_argument("--results", default="results")
    ap.add_argument("--tracking", default=None, help="the MLflow store (the profile's)")
    ap.add_argument("--tracking-credentials", default=None)
    args = ap.parse_args(argv)
    import os

    from lorarl.tracking.client import TRACKING_ENV
    from lorarl.tracking.credentials import CREDENTIALS_ENV

    for env, value in ((TRACKING_ENV, args.tracking), (CREDENTIALS_ENV, args.tracking_credentials)):
        if value:
            os.environ[env] = value
    view: Any = (rung_view(args.study, args.step, args.n, args.results, args.out) if args.what == "rung"
                 else look_view(args.study, args.hypothesis, int(args.n), args.results, args.out))
    decided = view.get("decided", view.get("decision"))
    print(f"[lorarl] {args.what} {args.step or args.hypothesis} ({args.n}): {decided}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
