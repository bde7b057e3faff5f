"""`python -m lorarl.gpucheck [--quick|--large|--cpu-smoke] [--vllm-only] [--minutes M] [--out DIR]`: run the checks, write the report.

Exit status: 0 when no check failed (a check that could not run is listed with why, and is not a pass),
1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from lorarl.gpucheck import checks as ck
from lorarl.gpucheck import budget as bd
from lorarl.gpucheck.shapes import ARCHS, build_model, twins

VLLM_CHECKS = ("vLLM rollouts + freshness gap", "vLLM evaluation", "merged-weight push time",
               "multi-LoRA pack sampling")


def settings(mode: str) -> dict[str, int]:
    """Doctor steps (the first is warm-up, dropped from the split), evaluation problems, pack steps and the
    pack check's completion budget (5 jobs: shorter than the twin's, the same for the pack and the solo jobs)."""
    return {"cpu-smoke": {"steps": 2, "eval_limit": 2, "pack_steps": 2, "pack_completion": 12},
            "quick": {"steps": 2, "eval_limit": 4, "pack_steps": 2, "pack_completion": 128}}.get(
        mode, {"steps": 3, "eval_limit": 4, "pack_steps": 2, "pack_completion": 256})


DOCTOR_ROWS = ("doctor", "step split", "rollout tokens/s", "training tokens/s", "peak memory", "bf16-mixed precision",
               "evaluation tokens/s")


def run(mode: str, out: Path, threads: int, vllm_only: bool = False, minutes: float | None = None) -> dict[str, Any]:
    """The checks in order of value (the reward_density twin's doctor, its pack, the 1-GPU torchrun path, the
    peft_zoo twin, the vLLM checks, the 7B twin), each started only when its need fits ``minutes`` (from the
    process's start) and cut at its own bound (lorarl.gpucheck.budget)."""
    import os

    import torch

    from lorarl.jobclock import process_age_s

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # no network on a GPU node:
        os.environ.setdefault(var, "1")  # nothing here may reach a hub (the jobs inherit it)
    t_start = time.perf_counter() - (process_age_s() or 0.0)  # the budget counts the interpreter and imports
    clock = bd.Budget(minutes, t_start)
    env = ck.environment()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # vLLM's CPU build: a 1 GiB KV cache per engine (its default, 92% of host memory, is refused)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    rows = Progress(out, lambda: _result(mode, env, list(rows), t_start, vllm_only, minutes))
    if mode != "cpu-smoke" and device != "cuda":
        rows.append(ck.row("device", "fail", f"no CUDA device ({env['device']['name']})",
                           why="the real-shape run needs a GPU; on a CPU use --cpu-smoke"))
        return _result(mode, env, rows, t_start, vllm_only, minutes)
    rows.append(ck.row("device", "pass", f"{env['device']['kind']}: {env['device']['name']} "
                                         f"({env['device']['memory_gb']:.1f} GiB)"))
    st = settings(mode)
    work = out / "work"
    vllm_why = ck.vllm_importable()
    if vllm_only and vllm_why is not None:  # asked for the vLLM checks alone: a missing vLLM fails the run
        rows.append(ck.row("vllm import", "fail", why=f"--vllm-only: {vllm_why}"))
        return _result(mode, env, rows, t_start, vllm_only, minutes)
    own_s = time.perf_counter() - t_start  # this process's own start: interpreter, torch, lorarl's modules
    start_s, started = bd.job_start_s(clock.bound(float("inf")))
    if not started:  # cut at the budget: a lower bound, and no less than this process's own start
        start_s = max(start_s, own_s)
    rows.append(ck.row("job start-up", "pass", f"{start_s:.1f} s to import a training job's stack in a fresh process",
                       start_s=start_s) if started else
                ck.row("job start-up", "cut", f"at least {start_s:.1f} s (a fresh process importing a training "
                       f"job's stack; this process's own start took {own_s:.1f} s)", why="cut at the budget's end",
                       start_s=start_s))
    built: list[tuple[float, float]] = []  # (model size, seconds to build and calibrate) of the twins so far

    for twin in twins(mode):
        if vllm_only and twin.study != "reward_density":  # only that twin carries the vLLM checks
            continue
        t = twin.cell["train"]
        n_rows = t["prompts_per_step"] * t["generations"]
        tag = twin.study
        mdir = work / "models" / twin.arch
        names = twin_rows(tag, vllm_only, vllm_why)
        arch = ARCHS[twin.arch]
        need = built[-1][1] * bd.model_size(arch) / built[-1][0] if built else 2 * start_s  # the build, measured
        if not clock.fits(need):  # not even the model's build and calibration fit: the twin's rows
            rows.extend(ck.not_run(n, clock.skipped(need)) for n in [f"model build: {twin.arch}", *names])
            continue
        t0 = time.perf_counter()
        try:
            info = build_model(twin.arch, mdir, device)
            speed = bd.calibrate(str(mdir.resolve()), n_rows, device)
        except Exception as err:  # noqa: BLE001 - reported as the twin's failure
            rows.append(ck.row(f"model build: {twin.arch}", "fail", f"{type(err).__name__}: {err}"[:300]))
            rows.extend(ck.not_run(n, f"its model build failed ({twin.arch})") for n in names)
            continue
        built.append((bd.model_size(arch), time.perf_counter() - t0))
        rows.append(bd.record(ck.row(f"model build: {twin.arch}", "pass",
                           f"{info['params'] / 1e6:,.1f} M parameters ({info['layers']} layers, hidden {info['hidden']}, "
                           f"vocab {info['vocab']}), random weights, built in {info['build_s']:.1f} s; "
                           f"{speed.decode_s_per_token * 1e3:.1f} ms per decoded token ({n_rows} rows), "
                           f"{speed.train_s_per_token * 1e6:.2f} us per trained token, {speed.svd_s:.2f} s per "
                           "float64 SVD of an MLP matrix", model=info, speed=speed.__dict__), need, built[-1][1]))
        model = str(mdir.resolve())
        doctor_s = bd.doctor_estimate(start_s, speed, n_rows, twin.completion, st["steps"], st["eval_limit"],
                                      arch.layers)
        if not vllm_only:
            seeds = ck.PACK_K if tag == "reward_density" else 1
            gated(rows, clock, [f"{c}: {tag}" for c in DOCTOR_ROWS], doctor_s, lambda: ck.doctor_checks(
                twin, ck.write_study(twin, model, work, st["steps"], seeds, st["eval_limit"]), work, st["steps"],
                st["eval_limit"], threads))
        if tag == "reward_density" and not vllm_only:  # LoRA without dropout: the twin that packs
            pstudy = ck.write_study(twin, model, work / "pack", st["pack_steps"], ck.PACK_K, st["eval_limit"],
                                    completion=st["pack_completion"])
            est = bd.pack_estimate(start_s, speed, n_rows, st["pack_completion"], st["pack_steps"], ck.PACK_K)
            gated(rows, clock, ["packed K=4 vs 4 solo"], est, lambda: [ck.packed_check(pstudy, work, threads)])
            est = 2 * bd.pack_estimate(0.0, speed, n_rows, st["pack_completion"], st["pack_steps"], ck.PACK_K)
            if mode == "cpu-smoke":  # CI's time: its code runs in-process on the tests' tiny model instead
                rows.append(ck.not_run(ck.INVARIANT, "cpu-smoke: a GPU's check (tests/gpucheck/test_gpucheck.py runs its job "
                                                     "on the tests' tiny model; the CPU's equality: test_solo_pack.py)"))
            else:
                gated(rows, clock, [ck.INVARIANT], est + start_s, lambda: [ck.invariant_check(pstudy, work)])
            est = bd.dist_estimate(start_s, speed, n_rows, st["pack_completion"], st["pack_steps"])
            gated(rows, clock, ["distributed launcher, 1 GPU"], est, lambda: [ck.dist_check(pstudy, work, threads)])
        if tag == "reward_density" and vllm_why is None:
            gated(rows, clock, [f"doctor: {tag} (vLLM)", *VLLM_CHECKS[2:]], doctor_s + 4 * start_s,
                  lambda: ck.doctor_checks(twin, ck.write_study(twin, model, work, st["steps"], 1, st["eval_limit"],
                                                                "vllm"), work, st["steps"], st["eval_limit"],
                                           threads, " (vLLM)") + ck.vllm_checks(twin, model, work))
    if vllm_why is not None:
        rows += [ck.not_run(name, vllm_why) for name in VLLM_CHECKS]
    return _result(mode, env, rows, t_start, vllm_only, minutes)


def gated(rows: list, clock: Any, names: list[str], estimate: float, work_fn: Any) -> None:
    """Run ``work_fn`` (-> rows) if its need (``estimate`` as the earlier checks calibrate it) fits the budget, its
    processes bounded (lorarl.gpucheck.budget.Budget.bound); else its rows read ``skipped (needs ~N s, M s left)``.
    A check cut at its bound keeps what it measured: its failed rows and the rows it did not reach read ``cut``."""
    need = clock.need(estimate)
    if not clock.fits(need):
        rows.extend(ck.not_run(n, clock.skipped(need)) for n in names)
        return
    bound = clock.bound(need)
    ck.DEADLINE[:] = [] if bound is None else [time.monotonic() + bound]
    ck.CUT.clear()
    t0 = time.perf_counter()
    try:
        got = work_fn()
    finally:
        ck.DEADLINE.clear()
    wall = time.perf_counter() - t0
    clock.took(estimate, wall)
    if ck.CUT:
        why = f"cut at its bound ({bound:.0f} s; needed ~{need:.0f} s)"
        seen = {r["check"] for r in got}
        got = [{**r, "status": "cut", "why": why} if r["status"] == "fail" else r for r in got]
        got += [ck.row(n, "cut", why=why) for n in names if n not in seen]
    if got:
        bd.record(got[0], estimate, wall, need)
    rows.extend(got)


def twin_rows(tag: str, vllm_only: bool, vllm_why: str | None) -> list[str]:
    """The rows a twin's checks give (listed as not run when the budget leaves no room for the twin at all)."""
    names = [] if vllm_only else [f"{c}: {tag}" for c in DOCTOR_ROWS]
    if tag == "reward_density":
        names += [] if vllm_only else ["packed K=4 vs 4 solo", ck.INVARIANT, "distributed launcher, 1 GPU"]
        names += [f"doctor: {tag} (vLLM)", *VLLM_CHECKS[2:]] if vllm_why is None else []
    return names


class Progress(list):
    """The rows so far: each one printed as it comes and the report rewritten (a run cut short keeps its figures)."""

    def __init__(self, out: Path, result: Any) -> None:
        super().__init__()
        self.out, self.result = out, result

    def append(self, r: dict[str, Any]) -> None:
        super().append(r)
        print(f"[gpucheck] {r['status']:>7}  {r['check']}: {r['figure'] or r['why']}", flush=True)
        write(self.out, self.result())

    def extend(self, rs: Any) -> None:
        for r in rs:
            self.append(r)

    def __iadd__(self, rs: Any) -> "Progress":
        self.extend(rs)
        return self


def write(out: Path, res: dict[str, Any]) -> None:
    (out / "gpucheck.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    (out / "gpucheck.md").write_text(render(res))


def _result(mode: str, env: dict, rows: list[dict], t_start: float, vllm_only: bool = False,
            minutes: float | None = None) -> dict[str, Any]:
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "fail", "cut", "not run")}
    return {"mode": mode, "vllm_only": vllm_only, "minutes": minutes, "ok": counts["fail"] == 0, "counts": counts,
            "wall_s": time.perf_counter() - t_start, "environment": env, "checks": rows}


def render(res: dict[str, Any]) -> str:
    env, d = res["environment"], res["environment"]["device"]
    c = res["counts"]
    lines = [f"# lorarl gpucheck ({res['mode']}): {'OK' if res['ok'] else 'FAILED'}", "",
             f"{c['pass']} passed, {c['fail']} failed, {c['cut']} cut at their bound, {c['not run']} not run, in {res['wall_s']:.0f} s "
             f"(`python -m lorarl.gpucheck" + {"cpu-smoke": " --cpu-smoke", "quick": " --quick",
                                                "large": " --large"}.get(res["mode"], "")
             + (" --vllm-only" if res.get("vllm_only") else "")
             + (f" --minutes {res['minutes']:g}" if res.get("minutes") is not None else "") + "`)", "",
             "| item | value |", "|---|---|",
             f"| device | {d['kind']}: {d['name']} x{d['count']} ({d['memory_gb']:.1f} GiB) |",
             f"| driver / CUDA | {d['driver']} / {d['cuda']} |",
             f"| Python | {env['python']} |"]
    lines += [f"| {k} | {v or 'not installed'} |" for k, v in env["libraries"].items()]
    lines += ["", "| check | result | figure | why | needed / took (s) |", "|---|---|---|---|---|"]
    for r in res["checks"]:
        mark = {"pass": "pass", "fail": "**FAIL**", "cut": "cut", "not run": "not run"}[r["status"]]
        d = r.get("data") or {}
        took = f"{d.get('need_s', d['estimate_s']):.0f} / {d['wall_s']:.0f}" if "estimate_s" in d else ""
        lines.append(f"| {r['check']} | {mark} | {r['figure']} | {r['why']} | {took} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lorarl.gpucheck", description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter completion budgets (512 and 256 tokens)")
    size.add_argument("--large", action="store_true", help="also a 7B (Qwen2.5-7B dimensions) twin")
    size.add_argument("--cpu-smoke", action="store_true", help="the same code path at tiny shapes on a CPU")
    ap.add_argument("--out", default="gpucheck", help="folder for gpucheck.md, gpucheck.json and work/")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per job (torch.set_num_threads)")
    ap.add_argument("--vllm-only", action="store_true",
                    help="only the vLLM checks (the reward_density twin's model, its vLLM doctor, the push and "
                         "multi-LoRA jobs): where only the vLLM install is in question")
    ap.add_argument("--minutes", type=float, default=None,
                    help="time budget: checks run in order of value, each only if its estimate fits (the rest: "
                         "'not run: budget'); default: no budget")
    a = ap.parse_args(argv)
    if a.threads < 1:
        ap.error(f"--threads must be >= 1 (got {a.threads})")
    if a.minutes is not None and not a.minutes > 0:
        ap.error(f"--minutes must be > 0 (got {a.minutes:g})")
    mode = "cpu-smoke" if a.cpu_smoke else "quick" if a.quick else "large" if a.large else "full"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(mode, out, a.threads, a.vllm_only, a.minutes)
    write(out, res)
    print(f"[gpucheck] wrote {out / 'gpucheck.md'} and {out / 'gpucheck.json'}")
    raise SystemExit(0 if res["ok"] else 1)
