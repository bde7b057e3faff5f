"""The cost ledger rolled up: `results/<study>/tables/cost.csv`, report.html's cost section, MLflow's `cost/*` and
`lorarl status`'s spent / projected line, all from the jobs' own records (lorarl.ledger), nothing else.

A record's seconds become device-seconds: GPU-seconds when the study's jobs held any GPU, else CPU core-seconds
(the study's `unit`; `gpu_h` and `cpu_core_h` are both kept). A pack's record is split among its members in
proportion to the completion tokens each got in that job (evenly when it trained none); a base build's record is
charged to the study as its own row (`base:<recipe>`, shared with any other study of the same base); the aggregate's
as `aggregate`. Rows: one per cell, one per setting (the axes but the seed), one for the study.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from lorarl import paths
from lorarl.ledger import DIR, PHASES

STUDY_ROWS = ("aggregate", "toy")  # stages charged to the study as a whole (their own row), not to one cell
EVAL_STAGES = ("evaluate",)  # jobs that are evaluations: all their time is the evaluation's (load, generation, grading)
EVAL_PHASES = ("evaluation",)  # the evaluation inside another job (a training job's snapshot evaluation)


def _load(paths: Iterable[Path]) -> list[dict]:
    out = []
    for p in sorted(paths):
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and rec.get("schema") == 1:
            out.append(rec)
    return out


def read_records(results: str | Path, study: str, bases: Iterable[str] = ()) -> list[dict]:
    """Every job record of the study: its cells', packs', toy job's, aggregate's, and the base builds named."""
    sdir = Path(results) / study
    files = list(sdir.glob(f"*/{DIR}/*.json")) + list(sdir.glob(f".*/{DIR}/*.json")) + \
        list(sdir.glob(f"{paths.pack_folder('*')}/{DIR}/*.json"))
    files += [p for b in bases for p in (Path(results) / "models" / ".logs" / b / DIR).glob("*.json")]
    return scheduler_tails(_load(set(files)))


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def sacct_elapsed(job_ids: list[str]) -> dict[str, int]:
    """sacct's ElapsedRaw of each ended job (one call; {} where sacct is missing or cannot answer)."""
    import shutil
    import subprocess

    if not job_ids or shutil.which("sacct") is None:
        return {}
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,ElapsedRaw"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    got = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0] in job_ids and parts[1].split()[0] in FINAL and parts[2].isdigit():
            got[parts[0]] = int(parts[2])
    return got


def scheduler_tails(records: list[dict], elapsed: dict[str, int] | None = None) -> list[dict]:
    """Each Slurm job's allocation after its process ended (the step's and the job's end on the node), which no clock
    in the job can see: sacct's ElapsedRaw less the record's wall time, as the record's `scheduler` phase. Only for a
    job with one record and no requeue (a requeued job's sacct line is its last run's); never negative; sacct's
    whole seconds round it. Nothing changes where sacct cannot say (not a Slurm job, sacct missing, job running)."""
    ids = sorted({str(r["job_id"]) for r in records if r.get("started_by") == "slurm" and r.get("job_id")})
    elapsed = sacct_elapsed(ids) if elapsed is None else elapsed
    by_job: dict[str, list[dict]] = {}
    for r in records:
        by_job.setdefault(str(r.get("job_id")), []).append(r)
    for job, recs in by_job.items():
        if job not in elapsed or len(recs) != 1 or recs[0].get("restart_count"):
            continue
        r = recs[0]
        tail = max(float(elapsed[job]) - float(r.get("wall_s") or 0.0), 0.0)
        if tail > 0:
            r["phases_s"] = {**(r.get("phases_s") or {}), "scheduler": round(tail, 3)}
            r["wall_s"] = round(float(r.get("wall_s") or 0.0) + tail, 3)
    return records


def charges(records: list[dict], unit: str | None = None) -> pd.DataFrame:
    """Long: one row per (record, charged cell, phase or idle): device-seconds (`unit`), GPU- and core-seconds."""
    unit = unit or ("gpu" if any((r.get("devices") or {}).get("gpus") for r in records) else "cpu")
    rows = []
    for r in records:
        dev = r.get("devices") or {}
        gpus, cpus = float(dev.get("gpus") or 0), float(dev.get("cpus") or 1)
        shares = _shares(r)
        parts = {**(r.get("phases_s") or {}), "idle": float(r.get("idle_s") or 0.0)}
        for cell, share in shares.items():
            for ph, s in parts.items():
                rows.append({"cell": cell, "stage": r.get("stage"), "phase": ph, "wall_s": s * share,
                             "gpu_s": s * share * gpus, "core_s": s * share * cpus,
                             "device_s": s * share * (gpus if unit == "gpu" else cpus),
                             "cpu_s": float(r.get("cpu_s") or 0.0) * share / max(len(parts), 1)})
    cols = ["cell", "stage", "phase", "wall_s", "gpu_s", "core_s", "device_s", "cpu_s"]
    return pd.DataFrame(rows, columns=cols).assign(unit=unit)


def _shares(r: dict) -> dict[str, float]:
    """Which cells a record is charged to, with what share: a pack's members by their tokens. Read off the record
    (report sits below the stage registry): a job of no study built a base model; `members` tokens: a pack's."""
    stage = r.get("stage")
    if r.get("study") is None:
        return {f"base:{r.get('cell')}": 1.0}
    if stage in STUDY_ROWS:
        return {stage: 1.0}
    tokens = r.get("members") or {}
    cells = [c for c in str(r.get("cell") or "").split(",") if c]
    total = sum(tokens.values())
    if total > 0:
        return {c: t / total for c, t in tokens.items()}
    return {c: 1.0 / len(cells) for c in cells} or {"?": 1.0}


def cost_table(study: Any, results: str | Path, price: float | None = None, records: list[dict] | None = None
               ) -> pd.DataFrame:
    """Per cell, per setting, per study: GPU-hours (0 on a CPU study), CPU core-hours, device-hours by phase and by
    stage, the idle share, the evaluation's device-hours and share (`eval_h`, `eval_share`: evaluation jobs and a
    training job's snapshot evaluations); `cost` = GPU-hours x `price` when a price per GPU-hour is given."""
    from lorarl.models import recipe_name
    from lorarl.language.study import every_cell

    cells = {c.id: c for c in every_cell(study)}
    bases = {n for c in cells.values() if (n := recipe_name(getattr(c.config, "model", "")))}  # a toy cell: none
    ch = charges(read_records(results, study.name, bases) if records is None else records)
    if ch.empty:
        return pd.DataFrame()
    keys = [a for a in study.axes if a != study.seed_axis]
    ch = ch.assign(**{k: ch["cell"].map(lambda c, k=k: cells[c].axes.get(k) if c in cells else None) for k in keys})
    out = [_row("cell", c, g, keys, cells.get(c)) for c, g in ch.groupby("cell", sort=False)]
    trained = ch[ch["cell"].isin(cells)]
    if keys and not trained.empty:
        for labels, g in trained.groupby(keys, sort=False, dropna=False):
            labels = labels if isinstance(labels, tuple) else (labels,)
            out.append(_row("setting", ", ".join(f"{k}={v}" for k, v in zip(keys, labels)), g, keys, None,
                            dict(zip(keys, labels))))
    out.append(_row("study", study.name, ch, keys, None))
    df = pd.DataFrame(out)
    if price is not None:
        df["cost"] = df["gpu_h"] * float(price)
    return df


def _row(level: str, name: str, g: pd.DataFrame, keys: list[str], cell: Any, labels: dict | None = None) -> dict:
    dev = g["device_s"].sum()
    row = {"level": level, "name": name, **{k: (cell.axes.get(k) if cell is not None else (labels or {}).get(k))
                                            for k in keys},
           "unit": g["unit"].iloc[0], "gpu_h": g["gpu_s"].sum() / 3600, "cpu_core_h": g["core_s"].sum() / 3600,
           "device_h": dev / 3600, "wall_h": g["wall_s"].sum() / 3600,
           "idle_share": g.loc[g["phase"] == "idle", "device_s"].sum() / dev if dev else 0.0,
           "cpu_idle_share": max(1 - g["cpu_s"].sum() / g["core_s"].sum(), 0.0) if g["core_s"].sum() else None}
    evals = g.loc[g["stage"].isin(EVAL_STAGES) | g["phase"].isin(EVAL_PHASES), "device_s"].sum()
    row.update({"eval_h": evals / 3600, "eval_share": evals / dev if dev else 0.0})  # the evaluation's share
    by_phase = g.groupby("phase")["device_s"].sum()
    row.update({f"phase/{p}_h": by_phase.get(p, 0.0) / 3600 for p in [*PHASES, "idle"]})
    by_stage = g.groupby("stage")["device_s"].sum()
    row.update({f"stage/{s}_h": v / 3600 for s, v in by_stage.items()})
    return row


def write(study: Any, results: str | Path, price: float | None = None) -> tuple[Path | None, pd.DataFrame]:
    """`results/<study>/tables/cost.csv` (nothing when no job left a record yet)."""
    from lorarl import paths

    df = cost_table(study, results, price)
    if df.empty:
        return None, df
    out = paths.path("table_csv", results=results, study=study.name).parent / "cost.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    return out, df


def parse_price(text: str) -> float | None:
    """`--gpu-hour-price` (the profile's `gpu_hour_price`): a number >= 0, or empty for none (hours only)."""
    import argparse

    if text in ("", "none", "None", "null"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"gpu_hour_price: {text!r} is not allowed; allowed: a number >= 0 (price "
                                         "per GPU-hour), or empty for none (hours only)")
    return value


# ---------------------------------------------------------------------------------------- spent and projected
def progress(study: Any, results: str | Path, df: pd.DataFrame | None = None) -> dict[str, Any]:
    """Spent so far (device-hours, the study's unit) and projected to the end: the training stages' device-hours per
    finished step times the steps still to train, plus what the other stages spent so far (not projected); for an
    adaptive study also the full grid's projection (every cell to its end) and device-hours per decided hypothesis."""
    from lorarl.report.adaptive import cell_steps, hypotheses_ledger
    from lorarl.language.study import cell_table, study_cells

    from lorarl.language.kinds import get_kind

    df = cost_table(study, results) if df is None else df
    if df.empty:
        return {}
    tot = df[df["level"] == "study"].iloc[0]
    if not get_kind(study.kind).cell_stages:  # one batch job (the toy): spent only, no training steps to project
        return {"unit": tot["unit"], "spent_h": float(tot["device_h"]), "gpu_h": float(tot["gpu_h"]),
                "cpu_core_h": float(tot["cpu_core_h"])}
    table = cell_table(study)
    done = cell_steps(study, table, results)
    train_h = sum(float(tot.get(f"stage/{s}_h", 0.0) or 0.0) for s in ("train", "pack"))
    steps_done = sum(done.values())
    out: dict[str, Any] = {"unit": tot["unit"], "spent_h": float(tot["device_h"]), "gpu_h": float(tot["gpu_h"]),
                           "cpu_core_h": float(tot["cpu_core_h"]), "steps_done": steps_done,
                           "per_step_h": train_h / steps_done if steps_done else None}
    planned = {c.id: c.config.train.steps for c in study_cells(study)}
    left = sum(max(n - done.get(c, 0), 0) for c, n in planned.items())
    out["steps_left"] = left
    out["projected_h"] = out["spent_h"] + left * out["per_step_h"] if out["per_step_h"] is not None else None
    if study.search is not None or study.hypotheses:
        out["full_grid_h"] = (out["spent_h"] - train_h + sum(planned.values()) * out["per_step_h"]
                              if out["per_step_h"] is not None else None)
        doc = hypotheses_ledger(study, results) or {}
        decided = [n for n, h in doc.get("hypotheses", {}).items() if h.get("decision") not in (None, "undecided")]
        out["hypotheses_decided"] = len(decided)
        out["per_decided_h"] = out["spent_h"] / len(decided) if decided else None
    return out


def progress_line(p: dict[str, Any]) -> str:
    """`lorarl status`'s cost line."""
    if not p:
        return "cost: no job record yet (results/<study>/<cell>/cost/)"
    u = "GPU-h" if p["unit"] == "gpu" else "CPU core-h"
    line = f"cost: {p['spent_h']:.4g} {u} spent ({p['cpu_core_h']:.4g} CPU core-h)"
    if p.get("projected_h") is not None:
        line += (f"; projected {p['projected_h']:.4g} {u} at the end ({p['per_step_h']:.3g} {u}/step x "
                 f"{p['steps_left']} steps left)")
    elif "steps_left" in p:
        line += "; no finished step yet to project from"
    if p.get("full_grid_h") is not None:
        line += f"; the full grid would take {p['full_grid_h']:.4g} {u}"
    if "hypotheses_decided" in p:
        per = p.get("per_decided_h")
        line += f"; {p['hypotheses_decided']} hypotheses decided" + (f", {per:.4g} {u} each" if per else "")
    return line


def status_line(study: Any, results: str | Path) -> str:
    """`lorarl status`'s cost line: spent so far and projected to the end."""
    try:
        return progress_line(progress(study, results))
    except Exception as err:  # noqa: BLE001 - a status line never fails `lorarl status`
        return f"cost: unreadable ({type(err).__name__}: {err})"


# ---------------------------------------------------------------------------------------------- report + MLflow
def html_section(df: pd.DataFrame, p: dict[str, Any], price: float | None) -> str:
    """report.html's cost section: device-hours by phase and by stage (the study row and each setting), idle share,
    the evaluation's share, cost at the configured price per GPU-hour (none: hours only)."""
    from lorarl.report.html import _e, _table

    if df.empty:
        return "<p><i>no job cost record yet (results/&lt;study&gt;/&lt;cell&gt;/cost/)</i></p>"
    u = "GPU-hours" if df["unit"].iloc[0] == "gpu" else "CPU core-hours"
    tot = df[df["level"] == "study"].iloc[0]
    head = (f"<p>Measured by every job (lorarl.ledger): <b>{tot['device_h']:.4g} {u}</b> "
            f"(GPU-hours {tot['gpu_h']:.4g}, CPU core-hours {tot['cpu_core_h']:.4g}), idle share "
            f"{tot['idle_share']:.1%}, evaluation share {tot['eval_share']:.1%}" + (f", cost {tot['cost']:.4g} at {price:g} per GPU-hour" if price is not None
                                          else ", no price per GPU-hour configured (hours only)") + ".</p>")
    if p:
        head += f"<p>{_e(progress_line(p))}</p>"
    phase = [c for c in df if c.startswith("phase/") and df[c].abs().sum() > 0]
    stage = [c for c in df if c.startswith("stage/")]
    show = df[df["level"].isin(["study", "setting"])]
    cols = ["level", "name", "device_h", "gpu_h", "cpu_core_h", "eval_share", "idle_share",
            *(["cost"] if "cost" in df else [])]
    return (head + f"<h3>{_e(u)} by phase</h3>" + _table(show[["level", "name", *phase]]) +
            f"<h3>{_e(u)} by stage</h3>" + _table(show[["level", "name", *stage]]) +
            "<h3>per cell</h3>" + _table(df[df["level"] == "cell"][cols]))


def metrics(row: pd.Series) -> dict[str, float]:
    """`cost/*` MLflow metrics of one cost.csv row."""
    keys = ["gpu_h", "cpu_core_h", "device_h", "idle_share", "eval_h", "eval_share", *(k for k in row.index if k.startswith(("phase/",
                                                                                                     "stage/")))]
    if "cost" in row:
        keys.append("cost")
    return {f"cost/{k}": float(row[k]) for k in keys if pd.notna(row.get(k))}


def log_mlflow(tracker: Any, parent_id: str, study: Any, results: str | Path, df: pd.DataFrame) -> int:
    """cost/* on each cell's current run (its summary's run id) and the study's totals on the parent; a value is
    logged again only when it changed. Returns the runs written."""
    import time

    from mlflow.entities import Metric

    from lorarl import paths
    from lorarl.io import read_json

    if df.empty:
        return 0
    targets = [(parent_id, df[df["level"] == "study"].iloc[0])]
    for _, row in df[df["level"] == "cell"].iterrows():
        s = read_json(paths.path("summary", results=results, study=study.name, cell=row["name"])) or {}
        if s.get("mlflow_run_id"):
            targets.append((s["mlflow_run_id"], row))
    ts, written = int(time.time() * 1000), 0
    for run_id, row in targets:
        have = tracker.retry("read a run", lambda r=run_id: tracker.client.get_run(r)).data.metrics
        changed = [Metric(k, v, ts, 0) for k, v in metrics(row).items() if have.get(k) != v]
        if changed:
            tracker.retry("log cost metrics", lambda r=run_id, m=changed: tracker.client.log_batch(r, metrics=m))
            written += 1
    return written
