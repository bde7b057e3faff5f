"""bench/gpucheck.py run as a command, and the checks of its CPU smoke run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from lorarl.gpucheck.main import VLLM_CHECKS


ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, out: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lorarl.gpucheck", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def check_cpu_smoke(proc: subprocess.CompletedProcess, out: Path) -> None:
    """What `--cpu-smoke` must show: every HF check's code path ran for real with its figure (the run itself is
    tests/test_wheelhouse.py's, in a venv installed from a wheelhouse with no index)."""
    res = json.loads((out / "gpucheck.json").read_text())
    md = (out / "gpucheck.md").read_text()
    assert proc.returncode == (0 if res["ok"] else 1), proc.stdout + proc.stderr
    rows = {r["check"]: r for r in res["checks"]}
    for study in ("reward_density", "peft_zoo"):
        for check in ("doctor", "step split", "rollout tokens/s", "training tokens/s", "peak memory",
                      "bf16-mixed precision", "evaluation tokens/s"):
            r = rows[f"{check}: {study}"]
            assert r["status"] == "pass", r
            assert f"| {check}: {study} | pass | {r['figure']} |" in md
        assert rows[f"doctor: {study}"]["data"]["estimate_s"] > 0  # the budget's estimate, beside its wall time
        sp = rows[f"step split: {study}"]["data"]["split"]
        assert sp["step_s"] > 0 and sp["policy_forward_backward_s"] > 0
        assert rows[f"rollout tokens/s: {study}"]["data"]["fill"] >= 0.99  # completions ran to the full budget
        assert rows[f"training tokens/s: {study}"]["data"]["tokens_per_s"] > 0
        prec = rows[f"bf16-mixed precision: {study}"]["data"]
        assert prec["precision"] == "bf16-mixed" and list(prec["trainable_dtypes"]) == ["float32"]
        assert rows[f"peak memory: {study}"]["data"]["peak_gb"] > 0
        assert rows[f"evaluation tokens/s: {study}"]["data"]["evaluation"]["problems"] == 2
        log = Path(rows[f"doctor: {study}"]["data"]["log"])
        assert "lorarl doctor" in log.read_text()  # the doctor itself ran
    pack = rows["packed K=4 vs 4 solo"]
    assert pack["status"] in ("pass", "fail") and pack["data"]["packed_wall_s"] > 0  # it ran; the ratio is a figure
    assert pack["data"]["solo_peak_gb"] > 0 and re.search(r"ratio \d\.\d\d", pack["figure"])
    assert rows["batch-invariant pack K=4 vs alone"]["status"] == "not run"  # a GPU's check; its job: test_gpucheck.py
    dist = rows["distributed launcher, 1 GPU"]  # torchrun, world 1: the same steps as the one-process solo job
    assert dist["status"] == "pass" and dist["data"]["metric_diff"] <= 1e-6 and dist["data"]["adapter_diff"] <= 1e-6, dist
    assert res["counts"]["fail"] == (pack["status"] == "fail")
    assert all(rows[n]["status"] == "not run" and rows[n]["why"].startswith("vllm not importable") for n in VLLM_CHECKS)
    assert all(r["figure"] for r in res["checks"] if r["status"] == "pass")  # no pass without its figure
    assert res["environment"]["device"]["kind"] == "cpu" and "| device | cpu:" in md
    assert rows["job start-up"]["data"]["start_s"] > 0
