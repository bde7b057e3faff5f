"""`lorarl status <study>`: where every cell of a study stands, from the files and squeue/sacct.

Per cell and stage (train, evaluate): `done` | `diverged` (finished early on a NaN/inf) | `running` (job id, step x/N) | `queued` (pending or
requeued) | `failed` (Slurm state + reason, and the step a rerun resumes from) | `interrupted`
(no job alive, a checkpoint to resume from) | `not started` | `stale` (done, but for another config).
Nothing here decides what runs; Snakemake does that from the files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lorarl.train import checkpoint
from lorarl import paths
from lorarl.io import pid_alive
from lorarl import jobids, provenance
from lorarl.numerics.divergence import DIVERGED, cell_state

FAILED_STATES = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                 "DEADLINE", "REVOKED"}


@dataclass
class StageStatus:
    state: str = "not started"
    job: str = ""
    step: str = ""
    detail: str = ""


@dataclass
class CellStatus:
    cell: str
    kind: str  # "cell" or "base"
    train: StageStatus = field(default_factory=StageStatus)
    evaluate: StageStatus = field(default_factory=StageStatus)
    flags: dict = field(default_factory=dict)  # collapse flag -> step (summary.json, lorarl.train.flags)


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def slurm_snapshot(job_ids: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(squeue rows, sacct rows) keyed by job id: one call each for the whole study."""
    queue: dict[str, dict] = {}
    out = _run(["squeue", "-h", "-o", "%i|%T|%r|%j"])
    for line in (out or "").splitlines():
        jid, state, reason, name = (line.split("|") + ["", "", "", ""])[:4]
        queue[jid] = {"State": state, "Reason": reason, "JobName": name}
    acct: dict[str, dict] = {}
    if job_ids:
        fields = ["JobID", "State", "ExitCode", "Reason", "Elapsed", "JobName"]
        out = _run(["sacct", "-n", "-X", "-P", "-j", ",".join(sorted(set(job_ids))), "-o", ",".join(fields)])
        for line in (out or "").splitlines():
            row = dict(zip(fields, line.split("|")))
            acct[row.get("JobID", "")] = row
    return queue, acct


def _last_error(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    for line in reversed(lines):
        if line.startswith("[lorarl] error:"):
            return line[len("[lorarl] error:"):].strip()[:200]
    return ""


def _stage(prov_file: Path, launcher_log: Path, done: bool, queue: dict, acct: dict,
           ckpt_root: Path | None) -> StageStatus:
    doc = provenance.read(prov_file)
    subs = doc.get("submissions", [])
    last = subs[-1] if subs else {}
    jid = str(last.get("job_id") or "")
    prog = checkpoint.progress(ckpt_root) if ckpt_root else None
    ckpts = checkpoint.complete_checkpoints(ckpt_root) if ckpt_root else []
    step = f"{prog['step']}/{prog['max_steps']}" if prog else ""
    if done:
        return StageStatus("done", jid, "", "")
    if not subs:
        return StageStatus("not started", "", step, "checkpoint at step %d" % ckpts[-1].step if ckpts else "")
    attempts = last.get("attempts", [])
    restarts = max((int(a.get("restart_count", 0) or 0) for a in attempts), default=0)
    if last.get("executor") == "slurm":
        name = last.get("job_name")
        q = queue.get(jid)
        if q and (not name or q.get("JobName") in ("", name)):
            if q["State"] in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"):
                why = f"requeued after {len(attempts)} attempt(s), " if attempts else ""
                return StageStatus("queued", jid, step, f"{why}{q['State'].lower()}: {q.get('Reason', '')}")
            return StageStatus("running", jid, step, q["State"].lower() + (f", requeued {restarts}x" if restarts else ""))
        a = acct.get(jid, {})
        state = (a.get("State") or "UNKNOWN").split()[0]
        if state in FAILED_STATES or state == "UNKNOWN" or state == "COMPLETED":
            reason = ", ".join(f"{k.lower()} {a[k]}" for k in ("ExitCode", "Reason") if a.get(k) not in (None, "", "None"))
            err = _last_error(launcher_log)
            resume = f"; a rerun resumes from step {ckpts[-1].step}" if ckpts else ""
            label = "failed" if state != "COMPLETED" else "incomplete"
            return StageStatus(label, jid, step, f"{state}" + (f" ({reason})" if reason else "")
                               + (f": {err}" if err else "") + resume)
        return StageStatus(state.lower(), jid, step, "")
    # local / debug executors: the job id is a process id on this machine
    if jid and pid_alive(jid) and prog is not None:
        return StageStatus("running", jid, step, last.get("executor", ""))
    err = _last_error(launcher_log)
    if err or "FAILED" in (launcher_log.read_text(errors="replace") if launcher_log.exists() else ""):
        resume = f"; a rerun resumes from step {ckpts[-1].step}" if ckpts else ""
        return StageStatus("failed", jid, step, (err or "see " + str(launcher_log)) + resume)
    if ckpts:
        return StageStatus("interrupted", jid, step, f"a rerun resumes from step {ckpts[-1].step}")
    return StageStatus("running" if jid and pid_alive(jid) else "interrupted", jid, step, last.get("executor", ""))


def study_status(study_path: str | Path | Any, results_dir: str | Path = "results") -> list[CellStatus]:
    """`study_path`: a study file, or a loaded Study."""
    from lorarl.language.study import base_cells, load_study

    study = load_study(study_path) if isinstance(study_path, (str, Path)) else study_path
    results_dir = Path(results_dir)
    cells = [(c, "cell") for c in status_cells(study, results_dir)] + [(b, "base") for b in base_cells(study)]
    slurm_ids: list[str] = []  # only Slurm submissions are looked up: a local job id is a pid on this machine
    for c, _ in cells:
        pdir = paths.cell_dir(results_dir, study.name, c.id) / "provenance"
        for f in pdir.glob("*.json"):
            slurm_ids += jobids.job_ids(f, executor="slurm")
    # no Slurm job in the study: squeue/sacct are not called (where Slurm's clients are installed but no
    # controller answers, each call waits for its timeout)
    queue, acct = slurm_snapshot(slurm_ids) if slurm_ids else ({}, {})
    stopped = _stopped(study, results_dir)
    out = []
    for c, kind in cells:
        cdir = paths.cell_dir(results_dir, study.name, c.id)
        st = CellStatus(c.id, kind)
        if kind == "cell":
            summary = cdir / "summary.json"
            done = summary.exists()
            ckpt_root = Path(paths.pattern("checkpoints", results=str(results_dir), study=study.name, cell=c.id))
            st.train = _stage(cdir / "provenance" / "train.json", cdir / "logs" / "train.log", done, queue, acct,
                              ckpt_root)
            if done:
                try:
                    doc = json.loads(summary.read_text())
                except json.JSONDecodeError:
                    doc = {}
                h = doc.get("config_hash")
                st.flags = dict(doc.get("flags") or {})
                if h and h != c.hash:
                    st.train = StageStatus("stale", st.train.job, "", f"trained with config {h}, now {c.hash}")
                elif cell_state(doc) == DIVERGED:  # finished, but stopped on a NaN/inf (lorarl.numerics.divergence)
                    st.train = StageStatus(DIVERGED, st.train.job, f"{doc.get('diverged_at_step')}/{c.config.train.optimizer_updates}",  # updates
                                           doc.get("diverged_reason", ""))
            else:
                st.train = _at_rung(st.train, c, cdir, stopped)
        else:
            st.train = StageStatus("-", "", "", "")
        evals = sorted((cdir / "eval").glob("*.json")) if (cdir / "eval").is_dir() else []
        provs = sorted((cdir / "provenance").glob("evaluate*.json")) if (cdir / "provenance").is_dir() else []
        if provs:
            states = []
            for pf in provs:
                target = pf.stem[len("evaluate-"):] if pf.stem.startswith("evaluate-") else "synthetic"
                done = (cdir / "eval" / f"{target}.json").exists()
                states.append(_stage(pf, cdir / "logs" / f"{pf.stem}.log", done, queue, acct, None))
            worst = next((s for s in states if s.state == "failed"), None) or \
                next((s for s in states if s.state not in ("done",)), None) or states[0]
            st.evaluate = StageStatus(worst.state, worst.job, "", worst.detail +
                                      (f" [{sum(s.state == 'done' for s in states)}/{len(states)} done]"
                                       if len(states) > 1 else ""))
        elif evals:
            st.evaluate = StageStatus("done", "", "", f"{len(evals)} benchmark(s)")
        out.append(st)
    return out


def status_cells(study: Any, results_dir: str | Path) -> list[Any]:
    """The study's cells, then the seeds a hypothesis added that the workflow started (lorarl.adaptive.ledger)."""
    from lorarl.language.study import cell_table, study_cells

    if not getattr(study, "hypotheses", None):
        return study_cells(study)
    from lorarl.adaptive.ledger import started_cells

    return started_cells(study, cell_table(study), results_dir)


def _stopped(study: Any, results_dir: Path) -> dict[str, int]:
    """An adaptive study's censored cells (lorarl.adaptive.ledger.stopped_now): cell -> the rung it stopped at."""
    if getattr(study, "search", None) is None:
        return {}
    from lorarl.adaptive.ledger import stopped_now
    from lorarl.language.study import cell_table

    return stopped_now(study, cell_table(study), results_dir)


def _at_rung(train: StageStatus, cell: Any, cdir: Path, stopped: dict[str, int]) -> StageStatus:
    """A cell of an adaptive study not trained to its end: `stopped` at the rung the search stopped it at
    (censored, not failed), or `at rung` while its rung waits for a decision (no job running)."""
    if cell.id not in stopped and not (cdir / "rungs").is_dir():
        return train  # no search stopped it (and a toy cell, which has no train steps, never has rungs)
    steps = cell.config.train.steps
    if cell.id in stopped:
        r = stopped[cell.id]
        return StageStatus("stopped", train.job, f"{r}/{steps}", f"censored at step {r} by the search; checkpoint kept "
                           "(a promotion or --config search=off resumes it)")
    marks = sorted(int(m.stem.split("-")[1]) for m in cdir.glob("rungs/step-*.json"))
    if marks and train.state in ("interrupted", "not started", "incomplete"):
        return StageStatus("at rung", train.job, f"{marks[-1]}/{steps}", f"waiting for the decision at step {marks[-1]}")
    return train


def status_notes(study: Any, rows: list[CellStatus], results_dir: str | Path, probe: Any = None) -> list[str]:
    """The lines under the table: each local base model still building (lorarl.build_progress), and, while no cell
    has started, each hub model or dataset this machine cannot get (every job would refuse it: lorarl.language.hubcheck;
    `probe`: the hub's, started before the study loaded, else one of `PROBE_S` now)."""
    from lorarl.language import hubcheck
    from lorarl.language.hubreach import Probe
    from lorarl.build_progress import base_lines
    from lorarl.models import study_recipes
    from lorarl.language.study import cell_table, study_cells

    notes = base_lines(study_recipes(study_cells(study)), results_dir)
    if hubcheck.enabled() and all(r.train.state == "not started" for r in rows if r.kind == "cell"):
        table = cell_table(study)
        notes += [f"cannot run here: {line}"  # one short probe of the hub: an offline machine answers at once
                  for line in hubcheck.missing(study, [*table.cells, *table.bases],
                                               probe=probe or Probe(hubcheck.PROBE_S))]
    return notes


def format_table(rows: list[CellStatus], bases: list[str] = ()) -> str:
    """`bases`: a line per local base model still building (lorarl.build_progress.base_lines), printed last."""
    table = [["cell", "train", "job", "step", "evaluate", "detail"]]
    for r in rows:
        flags = "flags: " + ", ".join(f"{k}@{v}" for k, v in r.flags.items()) if r.flags else ""
        detail = "; ".join(d for d in (r.train.detail, ("eval: " + r.evaluate.detail) if r.evaluate.detail else "",
                                       flags) if d)
        table.append([r.cell, r.train.state, r.train.job or r.evaluate.job, r.train.step, r.evaluate.state, detail])
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row[:5], widths)) + "  " + row[5] for row in table]
    counts: dict[str, int] = {}
    for r in rows:
        if r.kind == "cell":
            counts[r.train.state] = counts.get(r.train.state, 0) + 1
    lines.append("train: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join([line.rstrip() for line in lines] + list(bases))


def as_json(rows: list[CellStatus]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
