"""The checks of the acceptance run. Each returns a row: status pass | fail | not run, its figure, why.

A check passes only on a figure its own work produced; one that cannot run says why (``not run: ...``)
and never passes. The doctor twins go through ``lorarl doctor`` itself (the local launcher: a job process
per twin), the pack check through :mod:`lorarl.gpucheck.packjob` (one process per job, as a study runs them).
"""

from __future__ import annotations

import importlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lorarl.gpucheck.shapes import Twin, twin_study

HEADROOM = 0.90  # peak memory above this share of the device fails (as lorarl doctor's headroom check)
PACK_K = 4  # members of the packed job, against as many solo jobs of the same shape


DEADLINE: list[float] = []  # the running check's bound (time.monotonic) under --minutes: its processes are killed then
CUT: list[list[str]] = []  # the commands killed at the bound since the check started (lorarl.gpucheck.main.gated)


def sub(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run one check's process (its own session, so its job processes go with it); at the check's bound
    (DEADLINE) the whole group is killed, the command noted in CUT and the result says so (returncode -9)."""
    import os
    import signal

    timeout = max(DEADLINE[0] - time.monotonic(), 0.0) if DEADLINE else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += "\ncut: still running at its check's bound under --minutes"
        CUT.append(cmd)
        return subprocess.CompletedProcess(cmd, -9, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def row(name: str, status: str, figure: str = "", why: str = "", **data: Any) -> dict[str, Any]:
    return {"check": name, "status": status, "figure": figure, "why": why, "data": data}


def not_run(name: str, why: str) -> dict[str, Any]:
    return row(name, "not run", why=why)


def environment() -> dict[str, Any]:
    """Device, driver and library versions (as the doctor job sees them, plus the Python stack)."""
    from importlib.metadata import PackageNotFoundError, version

    from lorarl.pipeline.doctor.job import device_info

    libs = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "vllm"):
        try:
            libs[name] = version(name)
        except PackageNotFoundError:
            libs[name] = None
    return {"device": device_info(), "python": platform.python_version(), "libraries": libs}


def vllm_importable() -> str | None:
    """None when ``import vllm`` works, else why not (the vLLM checks say it)."""
    try:
        importlib.import_module("vllm")
    except Exception as err:  # noqa: BLE001 - any import failure means the engine cannot run here
        return f"vllm not importable ({type(err).__name__}: {str(err)[:200]})"
    return None


def write_study(twin: Twin, model_dir: str, work: Path, steps: int, seeds: int, eval_limit: int,
                engine: str = "hf", completion: int | None = None) -> Path:
    import torch

    doc = twin_study(twin, model_dir, steps, seeds, eval_limit, engine, completion,
                     eager=not torch.cuda.is_available())  # vLLM's CPU build: no inductor compile (minutes here)
    path = work / "studies" / f"{doc['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_doctor(study: Path, work: Path, steps: int, eval_limit: int, threads: int) -> tuple[int, dict | None, str]:
    """``lorarl doctor`` on the twin (a subprocess: its own exit status and output); its doctor.json."""
    res = work / "results"
    cmd = [sys.executable, "-m", "lorarl.cli", "doctor", str(study), "--steps", str(steps), "--results", str(res),
           "--eval-limit", str(eval_limit), "--threads", str(threads)]
    proc = sub(cmd)
    log = work / "logs" / f"doctor-{study.stem}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    name = yaml.safe_load(study.read_text())["name"]
    rep = res / name / "doctor" / "doctor.json"
    return proc.returncode, (json.loads(rep.read_text()) if rep.exists() else None), str(log)


def memory_projection(measured: dict) -> tuple[float | None, str]:
    """The memory plan's projected peak (GiB) of the doctor's smoke cell on the device it ran on: the doctor
    job records lorarl.memory.cells.device_projection as ``measured["memory_plan"]``."""
    plan = measured.get("memory_plan") or {}
    if plan.get("peak_gb"):
        return float(plan["peak_gb"]), "lorarl memory (the smoke cell on this device)"
    return None, f"no memory plan: {plan.get('error', 'the doctor recorded none')}"[:300]


def doctor_checks(twin: Twin, study: Path, work: Path, steps: int, eval_limit: int, threads: int,
                  label: str = "") -> list[dict[str, Any]]:
    """The doctor on one twin, and what its report says: step split, memory, tokens/s, precision, eval."""
    tag = f"{twin.study}{label}"
    t0 = time.perf_counter()
    rc, rep, log = run_doctor(study, work, steps, eval_limit, threads)
    wall = time.perf_counter() - t0
    if rep is None:
        return [row(f"doctor: {tag}", "fail", f"exit {rc}, no doctor.json", why=f"see {log}")]
    m = rep["measured"]
    bad = [c["check"] for c in m.get("checks", []) if not c["ok"]]
    out = [row(f"doctor: {tag}", "pass" if rep["ok"] and rc == 0 else "fail",
               f"exit {rc} in {wall:.0f} s; {len(m.get('checks', []))} doctor checks"
               + (f", failed: {', '.join(bad)}" if bad else ""), why="" if rep["ok"] else f"see {log}",
               wall_s=wall, log=log)]
    sp = m.get("split")
    if not sp:
        return out + [not_run(f"step split: {tag}", "the doctor's smoke training did not finish")]
    t = twin.cell["train"]
    budget = t["prompts_per_step"] * t["generations"] * twin.completion
    fill = sp["rollout_tokens_per_step"] / budget if budget else 0.0
    parts = {k: sp[k] for k in ("rollout_generation_s", "reward_s", "reference_forward_s",
                                "old_policy_forward_and_advantages_s", "policy_forward_backward_s")}
    out.append(row(f"step split: {tag}", "pass" if sp["step_s"] > 0 else "fail",
                   f"{sp['step_s']:.2f} s/step = " + " + ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in parts.items()),
                   split=sp))
    out.append(row(f"rollout tokens/s: {tag}", "pass" if sp["rollout_tokens_per_s"] > 0 and fill >= 0.99 else "fail",
                   f"{sp['rollout_tokens_per_s']:.1f} tokens/s; completions fill {fill:.1%} of "
                   f"{t['prompts_per_step']}x{t['generations']}x{twin.completion} tokens",
                   why="" if fill >= 0.99 else "completions stopped before the budget (EOS sampled)",
                   tokens_per_s=sp["rollout_tokens_per_s"], fill=fill))
    trained = sp["rollout_tokens_per_step"] / sp["policy_forward_backward_s"] if sp["policy_forward_backward_s"] else 0.0
    out.append(row(f"training tokens/s: {tag}", "pass" if trained > 0 else "fail",
                   f"{trained:.1f} completion tokens/s through the policy's forward + backward "
                   f"({sp['rollout_tokens_per_step']:.0f} tokens in {sp['policy_forward_backward_s']:.2f} s per step)",
                   tokens_per_s=trained))
    dev = m["device"]
    peak = m.get("peak_memory_gb", 0.0)
    share = peak / dev["memory_gb"] if dev["memory_gb"] else 0.0
    proj, src = memory_projection(m)
    vs = f"; projected {proj:.2f} GiB ({src}), measured/projected {peak / proj:.2f}" if proj else f"; projection: {src}"
    out.append(row(f"peak memory: {tag}", "pass" if 0 < share <= HEADROOM else "fail",
                   f"{peak:.2f} of {dev['memory_gb']:.1f} GiB ({share:.0%}, limit {HEADROOM:.0%}){vs}",
                   peak_gb=peak, projected_gb=proj, projection_source=src))
    prec, dtypes = m.get("precision"), m.get("trainable_dtypes") or {}
    ok = prec == "bf16-mixed" and list(dtypes) == ["float32"] and m.get("dtype") == "bfloat16"
    out.append(row(f"bf16-mixed precision: {tag}", "pass" if ok else "fail",
                   f"precision {prec}, weights loaded {m.get('dtype')}, trainable tensors "
                   + ", ".join(f"{k} x{v}" for k, v in dtypes.items()) + (", bf16 autocast" if prec == "bf16-mixed" else ""),
                   precision=prec, trainable_dtypes=dtypes, weights=m.get("dtype")))
    ev = (m.get("evaluation") or {}).get("synthetic")
    if ev:
        out.append(row(f"evaluation tokens/s: {tag}", "pass" if ev["tokens_per_s"] > 0 else "fail",
                       f"{ev['tokens_per_s']:.1f} tokens/s, {ev['seconds_per_problem']:.2f} s/problem "
                       f"({ev['problems']} problems)", evaluation=ev))
    else:
        out.append(not_run(f"evaluation tokens/s: {tag}", "the doctor's evaluation did not finish"))
    if label:  # the vLLM twin: its freshness gate (mean |logp_vllm - logp_policy| of the trained LoRA)
        gate = next((c for c in m.get("checks", []) if c["check"] == "rollout freshness gate"), None)
        out.append(row(f"freshness gap: {tag}", "pass" if gate and gate["ok"] else "fail",
                       gate["detail"] if gate else "no freshness gate in the doctor's report",
                       freshness=sp.get("freshness_logp_diff_max")))
    return out


def packed_check(study: Path, work: Path, threads: int) -> dict[str, Any]:
    """A packed job of K cells against K solo jobs of the same cells, one after another: wall and peak memory."""
    from lorarl.language.study import load_study, study_cells

    all_cells = study_cells(load_study(study))
    cells = [c.id for c in all_cells][:PACK_K]
    t = all_cells[0].config.train
    shape = f"{PACK_K} cells of P {t.prompts_per_step} x G {t.generations} x {t.max_completion_length} tokens, {t.steps} steps"
    if len(cells) < PACK_K:
        return not_run("packed K=4 vs 4 solo", f"the twin study has {len(cells)} cells, not {PACK_K}")

    def job(kind: str, ids: list[str], res: Path) -> dict:
        cmd = [sys.executable, "-m", "lorarl.gpucheck.packjob", kind, str(study), ",".join(ids), str(res), str(threads)]
        proc = sub(cmd)
        (work / "logs").mkdir(parents=True, exist_ok=True)
        (work / "logs" / f"pack-{kind}-{ids[0]}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode:
            raise RuntimeError(f"{kind} job exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    try:
        t0 = time.perf_counter()
        packed = job("pack", cells, work / "pack-results" / "packed")
        pw = time.perf_counter() - t0
        t0 = time.perf_counter()
        solo = [job("solo", [c], work / "pack-results" / "solo") for c in cells]
        sw = time.perf_counter() - t0
    except RuntimeError as err:
        return row("packed K=4 vs 4 solo", "fail", str(err)[:300])
    pm, sm = packed["peak_gb"], max(s["peak_gb"] for s in solo)
    ratio = pw / sw
    return row("packed K=4 vs 4 solo", "pass" if ratio < 1.0 else "fail",
               f"{shape}: wall {pw:.0f} s packed vs {sw:.0f} s for 4 solo jobs in turn (ratio {ratio:.2f}); peak memory "
               f"{pm:.2f} GiB packed vs {sm:.2f} GiB solo ({pm / sm:.2f}x)",
               why="" if ratio < 1.0 else "the pack was not faster than its members one after another",
               packed_wall_s=pw, solo_wall_s=sw, ratio=ratio, packed_peak_gb=pm, solo_peak_gb=sm,
               memory_kind=packed["memory_kind"])


COMPARED = ("loss", "kl", "entropy", "grad_norm")  # per-step metrics the 1-GPU torchrun job is held to


def dist_check(study: Path, work: Path, threads: int) -> dict[str, Any]:
    """The 1-GPU path of the distributed launcher: ``torchrun --standalone --nproc_per_node 1`` runs the pack
    check's first cell as a solo job (torch.distributed's environment set, world 1: what a rank of a larger
    layout runs) and is held to the one-process solo job of the same cell (same steps; the largest per-step
    difference of its metrics and of the trained adapter are the figures)."""
    import torch

    from lorarl.language.study import load_study, study_cells

    cell = study_cells(load_study(study))[0].id
    res = work / "pack-results" / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
           "lorarl.gpucheck.packjob", "solo", str(study), cell, str(res), str(threads)]
    t0 = time.perf_counter()
    proc = sub(cmd)
    wall = time.perf_counter() - t0
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "logs" / "torchrun-1gpu.log").write_text(proc.stdout + proc.stderr)
    name = yaml.safe_load(study.read_text())["name"]
    got, ref = res / name / cell, work / "pack-results" / "solo" / name / cell
    if proc.returncode or not (got / "summary.json").exists():
        return row("distributed launcher, 1 GPU", "fail", f"torchrun exit {proc.returncode}, no summary.json",
                   why=proc.stderr.strip()[-300:])
    mine, theirs = _metrics(got / "metrics.csv"), _metrics(ref / "metrics.csv")
    figure = f"torchrun world 1: {len(mine)} steps in {wall:.0f} s"
    if not theirs:
        return row("distributed launcher, 1 GPU", "pass", figure + "; no one-process job to compare (pack check not run)",
                   wall_s=wall)
    same = len(mine) == len(theirs)
    dm = max((abs(a[k] - b[k]) for a, b in zip(mine, theirs) for k in COMPARED if k in a and k in b), default=0.0)
    da = _adapter_diff(got / "adapter", ref / "adapter", torch)
    return row("distributed launcher, 1 GPU", "pass" if same else "fail",
               figure + f"; against the one-process job: max |diff| of {'/'.join(COMPARED)} per step {dm:.2e}, "
               f"of the trained adapter {da:.2e}", why="" if same else "a different number of steps",
               wall_s=wall, metric_diff=dm, adapter_diff=da)


def _metrics(path: Path) -> list[dict[str, float]]:
    import csv

    if not path.exists():
        return []
    with path.open() as f:
        return [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(f)]


def _adapter_diff(a: Path, b: Path, torch: Any) -> float:
    from safetensors.torch import load_file

    fa, fb = a / "adapter_model.safetensors", b / "adapter_model.safetensors"
    if not (fa.exists() and fb.exists()):
        return float("nan")
    x, y = load_file(str(fa)), load_file(str(fb))
    return max((float((x[k].float() - y[k].float()).abs().max()) for k in x if k in y), default=float("nan"))


def vllm_job(kind: str, twin: Twin, model_dir: str, work: Path) -> tuple[dict | None, str]:
    """One vLLM check in its own process (one engine per process); its JSON, or why it failed."""
    a = twin.cell["adapter"]
    scratch = work / f"vllm-{kind}"
    scratch.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "lorarl.gpucheck.vllmjob", kind, model_dir, str(a["rank"]), str(a["alpha"]),
           str(scratch)]
    proc = sub(cmd)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "logs" / f"vllm-{kind}-{twin.study}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        return None, f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def vllm_checks(twin: Twin, model_dir: str, work: Path) -> list[dict[str, Any]]:
    """Merged-weight push (time + freshness gap after it) and multi-LoRA pack sampling, each its own engine."""
    out = []
    for kind, name, to_row in (("push", "merged-weight push time", push_row),
                               ("multilora", "multi-LoRA pack sampling", multilora_row)):
        got, why = vllm_job(kind, twin, model_dir, work)
        out.append(to_row(got) if got else row(name, "fail", why[:300]))
    return out


def multilora_row(got: dict[str, Any]) -> dict[str, Any]:
    full = all(n == got["expected_rows"] for n in got["rows_per_member"])
    ok = full and got["distinct_members"] == got["members"] and got["tokens"] > 0
    why = "" if ok else ("a member got fewer rows than P x G" if not full else
                         "members with different adapters sampled the same tokens: the adapters were not applied")
    return row("multi-LoRA pack sampling", "pass" if ok else "fail",
               f"{got['members']} adapters in one engine, one generate call: rows per member {got['rows_per_member']} "
               f"(expected {got['expected_rows']}), {got['distinct_members']} distinct members' samples, "
               f"{got['tokens_per_s']:.1f} tokens/s", why=why, **got)


def push_row(got: dict[str, Any], threshold: float = 0.05) -> dict[str, Any]:
    ok = got["push_s"] > 0 and got["gap"] <= threshold
    return row("merged-weight push time", "pass" if ok else "fail",
               f"{got['push_s'] * 1e3:.1f} ms per push of {got['pushed_params'] / 1e6:,.1f} M parameters (median of "
               f"{got['pushes']}); freshness gap after the push {got['gap']:.4f} nats/token over {got['tokens']} "
               f"tokens (threshold {threshold})",
               why="" if ok else "the engine does not sample the pushed weights", **got)


INVARIANT = "batch-invariant pack K=4 vs alone"  # the check's row (lorarl.gpucheck.invariantjob)


def invariant_check(study: Path, work: Path) -> dict[str, Any]:
    """A K = 4 mixed-rank pack against each member alone, ``runtime.batch_invariant`` off and on (one process:
    :mod:`lorarl.gpucheck.invariantjob`): passes when, with the mode on, every member samples its solo run's token ids
    at every step and its adapter is within 1e-6; the figure also gives the mode off, the mode's cost per phase and the
    first operation of the base's forward whose output depends on the batch."""
    cmd = [sys.executable, "-m", "lorarl.gpucheck.invariantjob", str(study), str(work / "invariant-results")]
    proc = sub(cmd)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "logs" / "batch-invariant.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        return row(INVARIANT, "fail", f"job exit {proc.returncode}", why=proc.stderr.strip()[-300:])
    return invariant_row(json.loads(proc.stdout.strip().splitlines()[-1]))


def invariant_row(got: dict[str, Any]) -> dict[str, Any]:
    def side(mode: str) -> str:
        m, sd = got[mode]["members"].values(), got[mode]["seeds"]
        ci = f"[{sd['lower']:.2e}, {sd['upper']:.2e}]" if sd["lower"] is not None else "unbounded (no spread)"
        return (f"{mode}: {sum(x['tokens_equal'] for x in m)}/{len(m)} members sample their solo tokens, adapter max "
                f"|diff| {max(x['adapter_diff'] for x in m):.2e}, packed - alone {sd['metric']} over {len(sd['d'])} "
                f"seeds {sd['mean']:.2e} {ci}")

    def first(p: dict) -> str:
        return f"{p['first_module']} ({p['module']}, {p['max_diff']:.1e})" if p["first_module"] else "none"

    on = got["on"]["members"].values()
    ok = all(x["tokens_equal"] and x["adapter_diff"] <= 1e-6 for x in on)
    cost = ", ".join(f"{p} {s / got['off']['packed_s'][p]:.2f}x" for p, s in got["on"]["packed_s"].items()
                     if got["off"]["packed_s"].get(p))
    return row(INVARIANT, "pass" if ok else "fail",
               f"ranks {'/'.join(map(str, got['ranks']))}; {side('on')}; {side('off')}; packed on/off per phase: {cost}; "
               f"first batch-dependent module of the base's forward: off {first(got['probe_off'])}, on "
               f"{first(got['probe_on'])}",
               why="" if ok else "with the mode on a member differs from its solo run (see the probe's module)", **got)
