"""`python -m lorarl.gpucheck --cpu-smoke` where vLLM's CPU build is installed runs its vLLM checks for real: vllm
imports (no "not run: vllm not importable" rows), the --cpu-smoke twins have shapes vLLM's CPU kernels take, and
every vLLM check passes on the real engine: the vLLM twin's doctor (TRL's colocated rollouts with the freshness
gate, evaluation with `eval.backend: vllm`), the merged-weight push job and the multi-LoRA pack job. The whole
command runs with --vllm-only (its HF rows run in the main venv: tests/gpucheck/test_gpucheck.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorarl.gpucheck.checks import vllm_importable
from lorarl.gpucheck.main import VLLM_CHECKS
from lorarl.gpucheck.shapes import ARCHS, twins
from tests.support.gpucheck import _run

pytestmark = pytest.mark.vllm_real


def test_cpu_smoke_runs_every_vllm_check_for_real(tmp_path):
    """`--cpu-smoke --vllm-only`: the vLLM rows of `--cpu-smoke` alone (the HF rows are the same code that
    tests/gpucheck/test_gpucheck.py runs in the main venv; running them twice cost CI ten minutes)."""
    assert vllm_importable() is None  # gpucheck.main then adds the vLLM twin's doctor and the vLLM jobs' rows
    for twin in twins("cpu-smoke"):
        a = ARCHS[twin.arch]
        assert (a.head_dim or a.hidden // a.heads) >= 32, twin.arch  # vLLM's CPU attention refuses head_dim 16
    proc = _run("--cpu-smoke", "--vllm-only", out=tmp_path, timeout=1500)
    res = json.loads((tmp_path / "gpucheck.json").read_text())
    assert proc.returncode == 0 and res["ok"], proc.stdout + proc.stderr
    assert "--cpu-smoke --vllm-only`" in (tmp_path / "gpucheck.md").read_text()
    rows = {r["check"]: r for r in res["checks"]}
    assert not set(VLLM_CHECKS[:2]) & set(rows)  # the vLLM twin's rows replace the placeholders of a missing vllm
    assert not any(r["why"].startswith("vllm not importable") for r in res["checks"])
    vllm_rows = [r for name, r in rows.items() if name.endswith("(vLLM)")]
    assert {r["check"] for r in vllm_rows} >= {
        "doctor: reward_density (vLLM)", "step split: reward_density (vLLM)", "freshness gap: reward_density (vLLM)",
        "evaluation tokens/s: reward_density (vLLM)"}, sorted(rows)
    assert "doctor: reward_density" not in rows and not any("peft_zoo" in n for n in rows)  # HF rows: not here
    for r in vllm_rows + [rows["model build: tiny-qwen3"], rows["merged-weight push time"],
                          rows["multi-LoRA pack sampling"]]:
        assert r["status"] == "pass", r
    assert "lorarl doctor" in Path(rows["doctor: reward_density (vLLM)"]["data"]["log"]).read_text()
