"""What `python -m lorarl.pipeline.drills.faults` checks after every completed run (each (metric, step) once in
MLflow and metrics.csv, adapters and evaluations equal to the uninterrupted reference, no partial
output), and the figures it adds up and prints."""

from __future__ import annotations

import json
from pathlib import Path

ATOL = 1e-6  # adapter tolerance after a resume (CPU float32; bit-identical is counted separately)


def _mlflow_rows(results: Path, study: str) -> dict[str, dict[str, list[int]]]:
    """cell -> metric -> steps logged, of each cell's current (not deleted) run."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{results}/mlflow.db")
    exp = client.get_experiment_by_name(study)
    out: dict[str, dict[str, list[int]]] = {}
    for r in client.search_runs([exp.experiment_id]):
        cell = r.data.tags.get("lorarl.cell_id")
        if r.data.tags.get("lorarl.base") == "true" or cell is None:
            continue
        if cell in out:
            out[cell]["__runs__"] = out[cell].get("__runs__", [1]) + [1]
            continue
        out[cell] = {k: [m.step for m in client.get_metric_history(r.info.run_id, k)] for k in r.data.metrics}
    return out


def check(results: Path, ref: Path, study: str = "chaos", steps: int = 4) -> dict:
    """Lost / duplicated / extra (beyond `steps`) metric rows, adapter differences and bad outputs of a
    finished run."""
    import pandas as pd
    from safetensors.torch import load_file

    out = {"lost": 0, "duplicated": 0, "extra": 0, "adapters_identical": 0, "adapters_within_tol": 0, "max_abs_diff": 0.0,
           "eval_equal": 0, "bad_outputs": [], "extra_runs": 0, "cells": 0}
    rows = _mlflow_rows(results, study)
    for cell in sorted(p.name for p in (ref / study).iterdir() if (p / "summary.json").exists()):
        out["cells"] += 1
        d, r = results / study / cell, ref / study / cell
        want = set(range(1, steps + 1))
        m = pd.read_csv(d / "metrics.csv")
        got_steps = m["step"].tolist()
        out["lost"] += len(want - set(got_steps))
        out["duplicated"] += len(got_steps) - len(set(got_steps))
        out["extra"] += len(set(got_steps) - want)
        hist = rows.get(cell, {})
        out["extra_runs"] += len(hist.pop("__runs__", [1])) - 1
        for key in [c for c in m.columns if c != "step"]:
            got = hist.get(key, [])
            # a key recorded on some rows only (time/startup_s: a job's first row) is expected where it has a value
            present = want if m[key].notna().all() else set(m.loc[m[key].notna(), "step"]) & want
            out["lost"] += len(present - set(got))
            out["duplicated"] += len(got) - len(set(got))
            out["extra"] += len(set(got) - want)
        a, b = load_file(str(d / "adapter" / "adapter_model.safetensors")), load_file(
            str(r / "adapter" / "adapter_model.safetensors"))
        diff = max(float((a[k] - b[k]).abs().max()) for k in b) if a.keys() == b.keys() else float("inf")
        out["max_abs_diff"] = max(out["max_abs_diff"], diff)
        out["adapters_identical"] += diff == 0.0
        out["adapters_within_tol"] += diff <= ATOL
        ev, evr = (json.loads((x / "eval" / "synthetic.json").read_text())["metrics"] for x in (d, r))
        out["eval_equal"] += ev == evr
    for p in results.joinpath(study).rglob("*"):  # every output parses; no temporary file among them
        if ".checkpoints" in p.parts or "logs" in p.parts or "provenance" in p.parts or not p.is_file():
            continue
        if p.name.endswith(".tmp") or ".train.tmp" in p.parts:
            out["bad_outputs"].append(f"{p} (temporary)")
            continue
        try:
            if p.suffix == ".json":
                json.loads(p.read_text())
            elif p.suffix == ".csv":
                pd.read_csv(p)
            elif p.suffix == ".parquet":
                pd.read_parquet(p)
            elif p.suffix == ".jsonl":
                [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        except Exception as err:  # noqa: BLE001 - anything unreadable is a partial output
            out["bad_outputs"].append(f"{p} ({type(err).__name__})")
    return out


SUMS = ("passes", "completed", "invocations", "lost", "duplicated", "extra", "extra_runs", "cells",
        "adapters_identical", "adapters_within_tol", "eval_equal")


def merge(figs: list[dict]) -> dict:
    out: dict = {k: sum(f[k] for f in figs) for k in SUMS}
    out["max_abs_diff"] = max((f["max_abs_diff"] for f in figs), default=0.0)
    out["bad_outputs"] = [b for f in figs for b in f["bad_outputs"]]
    for k in ("kills", "missed"):
        out[k] = {s: sum(f[k].get(s, 0) for f in figs) for s in figs[0][k]} if figs else {}
    return out


def report(f: dict) -> str:
    lines = ["", "| stage killed (SIGKILL) | kills | missed (process ended first, retried) |", "|---|---|---|"]
    lines += [f"| {s} | {n} | {f['missed'].get(s, 0)} |" for s, n in f["kills"].items()]
    lines += ["", f"study runs completed after the kills: {f['completed']}/{f['passes']} "
                  f"({f['invocations']} `snakemake all` invocations)",
              f"metric rows (MLflow + metrics.csv) lost: {f['lost']}, duplicated: {f['duplicated']}, "
              f"beyond the last step: {f.get('extra', 0)}; "
              f"extra live MLflow runs: {f['extra_runs']}",
              f"final adapters bit-identical to the uninterrupted run: {f['adapters_identical']}/{f['cells']} "
              f"(within {ATOL}: {f['adapters_within_tol']}, max |diff| {f['max_abs_diff']:.2e}); "
              f"evaluations equal: {f['eval_equal']}/{f['cells']}",
              f"partial or temporary files among the outputs: {len(f['bad_outputs'])}"
              + (": " + "; ".join(f["bad_outputs"][:5]) if f["bad_outputs"] else ""),
              f"wall time: {f['wall_s']:.0f}s ({f['workers']} worker(s) side by side)"]
    return "\n".join(lines)
