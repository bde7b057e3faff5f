"""Login side of `lorarl doctor`: smoke study, launch through the profile, projection, JSON + markdown report.

See :mod:`lorarl.pipeline.doctor.job` for what the job measures. The projection's assumptions are part of the report.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lorarl.pipeline.doctor.job import MEASURED, REQUEST
from lorarl.pipeline.doctor.clock import launcher_probe, run_child, snakemake_dry_run
from lorarl.pipeline.doctor.jobs import parse_job_stats
from lorarl.pipeline.doctor.packs import describe as describe_packs, places_check
from lorarl.pipeline.doctor.projection import project
from lorarl.language.profiles import read_profile
from lorarl.language.kinds import KINDS, get_kind
from lorarl.language.study import StudyError, find_cell, load_study_to_run, study_cells

ROOT = Path(__file__).resolve().parents[3]


OVERRIDABLE = ("launcher", "slurm", "tracking", "tracking_credentials", "pack")  # what `--config KEY=VALUE` may set
SMOKE_SUFFIX = "-doctor"  # the smoke study's name (and MLflow experiment): never the real study's runs


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """`--config KEY=VALUE ...` as Snakemake reads it (VALUE is YAML): the profile's settings, overridden."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in OVERRIDABLE:
            raise StudyError(f"--config {item!r}: expected KEY=VALUE with KEY one of {', '.join(OVERRIDABLE)}")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as err:
            raise StudyError(f"--config {key}: {value!r} is not YAML ({err})") from None
    if "slurm" in out and not isinstance(out["slurm"], dict):
        raise StudyError(f"--config slurm: must be a mapping of stage -> Slurm parameters, got {out['slurm']!r}")
    if "pack" in out:
        check_pack(out["pack"], "--config pack")
    if "launcher" in out and out["launcher"] not in ("debug", "local", "slurm"):
        raise StudyError(f"--config launcher: {out['launcher']!r}; allowed: debug, local, slurm")
    return out


def check_pack(setting: Any, where: str) -> None:
    """The ``pack`` setting as Snakemake's config load checks it (lorarl.pack.plan: max_cells, resident_places)."""
    from lorarl.pack.plan import max_cells, resident_places

    try:
        max_cells(setting)
        resident_places(setting)
    except ValueError as err:
        raise StudyError(f"{where}: {err}") from None


def use_profile_tracking(prof: dict[str, Any], results_dir: str) -> None:
    """The profile's MLflow store into this process's environment (the submitted job carries it); a bad
    value exits 2 before anything is written. sqlite = the smoke folder's own mlflow.db."""
    import os

    from lorarl.tracking.client import TRACKING_ENV, is_server, resolve_tracking
    from lorarl.tracking.credentials import CREDENTIALS_ENV, check_client

    uri = resolve_tracking(str(prof["tracking"]), results_dir)  # TrackingError: exit 2
    creds = prof.get("tracking_credentials") or None
    if is_server(uri):
        check_client(uri, creds)
    os.environ[TRACKING_ENV] = str(prof["tracking"])
    if creds:
        os.environ[CREDENTIALS_ENV] = str(creds)


def where_it_ran(prov: Path, executor: str, requested: dict[str, Any], wait_s: float = 120) -> dict[str, Any]:
    """The doctor job's id(s), and for Slurm its accounting record (partition, node, state, elapsed,
    allocated resources) from sacct, next to what the profile asked for."""
    import time

    from lorarl import jobids, provenance
    from lorarl.pipeline.jobs.slurm import ACTIVE, sacct_info

    ids = jobids.job_ids(prov) if prov.exists() else []
    attempts = provenance.attempts(prov) if prov.exists() else []
    out: dict[str, Any] = {"executor": executor, "job_ids": ids, "job_id": ids[-1] if ids else None,
                           "requested_partition": (requested or {}).get("partition"),
                           "host": attempts[-1].get("host") if attempts else None}
    if executor == "slurm" and out["job_id"]:
        deadline = time.monotonic() + wait_s  # the result is written before the job ends: wait for its record
        while True:
            info = sacct_info(out["job_id"], fields=SACCT_FIELDS)
            if not info or info.get("State", "UNKNOWN").split()[0] not in ACTIVE or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        out["sacct"] = info
        out.update(partition=info.get("Partition"), node=info.get("NodeList"), state=info.get("State"),
                   elapsed=info.get("Elapsed"), alloc=info.get("AllocTRES"))
    return out


SACCT_FIELDS = ["JobID", "State", "ExitCode", "Partition", "NodeList", "Elapsed", "AllocTRES", "Start", "End"]


def smoke_study(study: Any, cell: Any, steps: int, eval_limit: int, results_dir: str) -> dict[str, Any]:
    """A one-cell study: the chosen cell with ``steps`` steps, ``eval_limit`` problems per benchmark."""
    from lorarl.models import recipe_name, resolve_model

    d = cell.config.model_dump(mode="json")
    if recipe_name(d["model"]) is not None:  # the smoke run has its own results folder: point at the real model
        d["model"] = str(Path(resolve_model(d["model"], results_dir)).resolve())
    teacher = d["reward"].get("teacher")
    if teacher and recipe_name(teacher) is not None:
        d["reward"]["teacher"] = str(Path(resolve_model(teacher, results_dir)).resolve())
    t = d["train"]
    t.update(steps=steps, checkpoint_every=0)
    if t["kl_monitor_every"]:
        t["kl_monitor_every"] = min(t["kl_monitor_every"], steps)  # measured once at least, projected at its rate
    d["eval"]["eval_every"] = 0
    d["eval"]["curve_benchmarks"] = None
    benches = d["eval"]["benchmarks"] or {"synthetic": {}}
    for b in benches.values():
        b["limit"] = min(b.get("limit") or eval_limit, eval_limit)
    d["eval"]["benchmarks"] = benches
    return {"name": study.name + SMOKE_SUFFIX, "defaults": d,  # axis `smoke`: `cell` is a report column
            "axes": {"smoke": {"values": [{"label": cell.id, "set": {"seed": d["seed"]}}]}}}


def _fmt_s(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def _fmt_h(h: float) -> str:
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"


def _where(w: dict, job: dict) -> str:
    """Where the doctor job ran: Slurm's accounting record, else the executor and host."""
    if w.get("partition"):
        return (f"Slurm job {w['job_id']}, partition {w['partition']}, node {w.get('node')}, {w.get('state')} "
                f"in {w.get('elapsed')} (allocated {w.get('alloc') or '?'}; GPUs visible to the job: "
                f"{job.get('cuda_visible_devices', 'none')})")
    return f"{w.get('executor', '?')} job {w.get('job_id')} on {w.get('host') or job.get('host', '?')}"


def _dtype(m: dict) -> str:
    """train.precision as the smoke training resolved it: weights loaded, trainable tensors, autocast."""
    if not m.get("precision"):
        return f"weights {m.get('dtype', '?')}"
    trainable = ", ".join(f"{k} x{v}" for k, v in (m.get("trainable_dtypes") or {}).items()) or "?"
    autocast = "bf16 autocast" if m["precision"] == "bf16-mixed" else "no autocast"
    return f"{m['precision']}: weights loaded in {m.get('dtype', '?')}, trainable tensors {trainable}, {autocast}"


def _vs_plan(m: dict, kind: str) -> str:
    """The memory plan's projection beside the measured peak, with measured/projected (the plan's honesty)."""
    plan, peak = m.get("memory_plan") or {}, m.get("peak_memory_gb")
    if "peak_gb" not in plan or not peak:
        return f"(memory plan: {plan.get('error', 'not made')})"
    what = ("torch.cuda.max_memory_allocated over the job" if kind == "cuda" else
            "process RSS peak, which also holds Python and its libraries")
    return (f"(measured: {what}); `lorarl memory` projects {plan['peak_gb']:.2f} GiB: measured/projected "
            f"{peak / plan['peak_gb']:.2f}" if plan["peak_gb"] else "")


def render_markdown(rep: dict) -> str:
    m, d = rep["measured"], rep["measured"]["device"]
    lines = [f"# lorarl doctor: {rep['study']} / {rep['cell']} ({'OK' if rep['ok'] else 'FAILED'})", "",
             f"profile `{rep['profile']['name']}` (launcher {rep['profile']['launcher']}), {m.get('steps')} smoke steps", "",
             "| item | value |", "|---|---|",
             f"| ran where | {_where(rep.get('where') or {}, m.get('job') or {})} |",
             f"| device | {d['kind']}: {d['name']} x{d['count']} ({d['memory_gb']:.1f} GiB) |",
             f"| driver / CUDA / torch | {d['driver']} / {d['cuda']} / {d['torch']} |",
             f"| dtype used | {_dtype(m)} |",
             f"| peak {'GPU' if d['kind'] == 'cuda' else 'CPU'} memory | {m.get('peak_memory_gb', float('nan')):.2f} GiB "
             f"{_vs_plan(m, d['kind'])} |"]
    sp = m.get("split")
    if sp:
        lines += [f"| step time | {_fmt_s(sp['step_s'])} |",
                  f"| - rollout generation | {_fmt_s(sp['rollout_generation_s'])} |",
                  f"| - reference forward | {_fmt_s(sp['reference_forward_s'])} |",
                  f"| - old-policy forward + advantages | {_fmt_s(sp['old_policy_forward_and_advantages_s'])} |",
                  f"| - policy forward/backward + optimiser | {_fmt_s(sp['policy_forward_backward_s'])} |",
                  f"| - reward | {_fmt_s(sp['reward_s'])} |",
                  f"| KL monitors (per run, outside the step) | {_fmt_s(sp['kl_monitor_per_run_s'])} |",
                  f"| rollout tokens/s | {sp['rollout_tokens_per_s']:.1f} |"]
    for name, e in (m.get("evaluation") or {}).items():
        lines.append(f"| eval {name} | {e['seconds_per_problem']:.3g} s/problem, {e['tokens_per_s']:.1f} tokens/s "
                     f"({e['problems']} problems x {e['samples'] // max(e['problems'], 1)} samples) |")
    lines += ["", "## Checks", "", "| check | ok | detail |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else '**NO**'} | {c['detail']} |" for c in m["checks"]]
    p = rep.get("projection")
    if p:
        steps_s = [c["step_s"] for c in p.get("per_cell") or []] or [0.0]
        rounds = [c["rounds_per_rollout"] for c in p.get("per_cell") or []] or [1.0]
        rate = p.get("degenerate_rate")
        jobs = ", ".join(f"{n} {r}" for r, n in (p.get("jobs") or {}).items())
        st = p.get("startup") or {}
        lines += ["", "## Projection of the whole study", "",
                  f"{p['cells']} cells, {p['steps']} training steps; every job the run executes ({jobs}): train "
                  f"{_fmt_h(p['train_h'])} + evaluation {_fmt_h(p['eval_h'])} + diagnostics "
                  f"{_fmt_h(p['diagnostics_h'])} + aggregation {_fmt_h(p.get('aggregate_h', 0.0))}"
                  + (f" + base models {_fmt_h(p['base_h'])}" if p.get("base_h") else "")
                  + f" = **{_fmt_h(p['serial_h'])} serial**, about **{_fmt_h(p['wall_h'])} wall** with the profile's "
                  f"{p['concurrent_jobs']} {'cores' if p.get('shared_machine') else 'concurrent jobs'}"
                  + (f" on this machine as loaded now ({_fmt_h(p['wall_idle_h'])} on an idle one)"
                     if p.get("shared_machine") and "wall_idle_h" in p else "")
                  + f", **{p['gpu_hours']:.2f} GPU-hours**"
                  + (f" (training jobs on {p['layout']['train']})" if p.get("layout") else "") + ".", ""]
        if st:
            lines += ["Start-up of every job (measured here, seconds): " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in st.items()) + ".", ""]
        if p.get("packs"):
            lines += [describe_packs(p["packs"]), ""]
        lines += [f"Projected step time per cell {_fmt_s(min(steps_s))} to {_fmt_s(max(steps_s))}; generation rounds "
                  f"per rollout {min(rounds):.2f} to {max(rounds):.2f} (degenerate prompt groups in the smoke: "
                  f"{'not measured' if rate is None else f'{rate:.0%}'}).", "", "Assumptions:", ""]
        lines += [f"- {a}" for a in p["assumptions"]]
    return "\n".join(lines) + "\n"


def run_doctor(study_path: str, cell_id: str | None = None, steps: int = 3, profile: str | None = None,
               results_dir: str = "results", eval_limit: int = 8, threads: int = 1,
               overrides: list[str] | None = None) -> int:
    """Smoke one cell through the study's launcher + profile, then report and project. Exit status."""
    from lorarl.pipeline.jobs.launch import launch
    from lorarl.pipeline.jobs.stages import get_stage
    from lorarl.pipeline.doctor.stage import NAME as STAGE  # the doctor's stage, registered there
    from lorarl.models import recipe_name
    from lorarl.provenance import provenance_path

    if steps < 1 or eval_limit < 1:
        raise StudyError(f"--steps and --eval-limit must be >= 1 (got {steps}, {eval_limit})")
    prof = read_profile(profile, parse_overrides(overrides))
    check_pack(prof["pack"], f"profile {prof['name']!r}: pack")
    study = load_study_to_run(study_path, prof["hub_check"])  # hub models/datasets: as Snakemake with this profile
    if "train" not in get_kind(study.kind).cell_stages:
        allowed = ", ".join(k.name for k in KINDS.values() if "train" in k.cell_stages)
        raise StudyError(f"lorarl doctor runs studies whose cells train; {study.name} is kind {study.kind!r} "
                         f"(allowed: {allowed})")
    cells = study_cells(study)
    cell = find_cell(study, cell_id) if cell_id else cells[0]
    out_dir = Path(results_dir) / study.name / "doctor"
    smoke_dir = out_dir / "run"
    use_profile_tracking(prof, str(smoke_dir))  # bad store: exit 2, nothing written yet
    out_dir.mkdir(parents=True, exist_ok=True)
    smoke = smoke_study(study, cell, steps, eval_limit, results_dir)
    smoke_yaml = out_dir / "smoke.yaml"
    smoke_yaml.write_text(yaml.safe_dump(smoke, sort_keys=False))
    (out_dir / REQUEST).write_text(json.dumps({"study": str(Path(study_path).resolve()), "cell": cell.id,
                                               "results": str(Path(results_dir).resolve()),
                                               "steps": steps, "eval_limit": eval_limit,
                                               "profile": prof["name"]}) + "\n")
    (smoke_dir / MEASURED).unlink(missing_ok=True)
    slurm = prof["slurm"] or {}
    login: dict[str, Any] = {"launcher": launcher_probe(study_path)}  # what every launcher pays first
    name = recipe_name(cell.config.model)
    if name is not None and not (Path(results_dir) / "models" / name / "config.json").exists():
        t0 = time.time()
        rc = launch("base", str(smoke_yaml), name, results_dir, prof["launcher"], threads,
                    slurm.get(get_stage("base").resources_key))
        login["base"] = {"recipe": name, "wall_s": time.time() - t0}
        if rc:
            print(f"error: building the base model {name!r} failed (exit {rc})", file=sys.stderr)
            return 1
    login["submitted_epoch"] = time.time()
    rc = launch(STAGE, str(smoke_yaml), cell.id, str(smoke_dir), prof["launcher"], threads,
                slurm.get(get_stage(STAGE).resources_key))
    login["returned_epoch"] = time.time()
    prov = provenance_path(str(smoke_dir.resolve()), smoke["name"], cell.id, STAGE)
    where = where_it_ran(prov, prof["launcher"], slurm.get(get_stage(STAGE).resources_key) or {})
    mfile = smoke_dir / MEASURED
    if not mfile.exists():
        print(f"error: the doctor job wrote no measurements (exit {rc}; {_where(where, {})}); see its log above",
              file=sys.stderr)
        return 1
    measured = json.loads(mfile.read_text())
    measured["split"] = measured.get("split") or None
    checks = measured.setdefault("checks", [])
    if measured.get("ok"):  # the study's last job, on this host as Snakemake runs it, over the smoke's results
        login["aggregate"] = run_child([sys.executable, "-m", "lorarl.cli", "aggregate", str(smoke_yaml), "--results",
                                        str(smoke_dir), "--tracking", str(prof["tracking"])])
        checks.append({"check": "aggregation", "ok": login["aggregate"]["rc"] == 0, "seconds":
                       round(login["aggregate"]["wall_s"], 3), "detail": login["aggregate"].pop("tail")[-300:]
                       if login["aggregate"]["rc"] else "`lorarl aggregate` of the smoke study"})
        if importlib.util.find_spec("snakemake") is not None:  # where the study's Snakemake runs (not a bare node)
            login["snakemake"] = snakemake_dry_run(ROOT, study_path, results_dir, prof.get("dir"), overrides)
            login["snakemake"]["jobs"] = parse_job_stats(login["snakemake"].pop("log")) \
                if login["snakemake"]["rc"] == 0 else login["snakemake"].pop("log")[-300:]
    measured["login"] = login
    if where.get("requested_partition") and where.get("partition"):  # Slurm: did it land where the study trains?
        same = where["partition"] == where["requested_partition"]
        checks.append({"check": "ran on the study's train partition", "ok": same, "seconds": 0.0,
                       "detail": f"job {where['job_id']} on partition {where['partition']} (profile: "
                                 f"{where['requested_partition']}), node {where.get('node')}"})
    ok = bool(measured.get("ok")) and rc == 0 and all(c["ok"] for c in checks)
    rep = {"study": study.name, "cell": cell.id, "profile": {k: v for k, v in prof.items()
                                                              if k != "tracking_credentials"},
           "ok": ok, "where": where, "measured": measured}
    if ok and measured.get("split"):
        rep["projection"] = p = project(study, cell, measured, prof, results_dir)
        dry = login.get("snakemake")
        same = dry is None or (dry.get("rc") == 0 and dry.get("jobs") == p["jobs"])
        checks.append({"check": "job list (Snakemake's dry run)", "ok": same, "seconds": round((dry or {}).get(
            "wall_s", 0), 3), "detail": "not compared: snakemake is not installed here" if dry is None else
            f"{dry.get('jobs')} ({'the same' if same else 'projected: ' + str(p['jobs'])})"})
        places = places_check(p, measured["device"]["kind"])  # as each resident job checks at its start
        checks += [places] if places else []
        rep["ok"] = same and (places is None or places["ok"])
    (out_dir / "doctor.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    md = render_markdown(rep)
    (out_dir / "doctor.md").write_text(md)
    print(md)
    return 0 if rep["ok"] else 1
