"""`python -m lorarl.gpucheck --cpu-smoke` where vLLM's CPU build is installed runs its vLLM checks for real: vllm
imports (no "not run: vllm not importable" rows), the --cpu-smoke twins have shapes vLLM's CPU kernels take, and
every vLLM check passes on the real engine: the vLLM twin's doctor (TRL's colocated rollouts with the freshness
gate, evaluation with `eval.backend: vllm`), the merged-weight push job and the multi-LoRA pack job. The whole
command runs as tests/test_gpucheck.py runs it in the main venv (where the vLLM rows read `not run`)."""

from __future__ import annotations

import json

import pytest

from lorarl.gpucheck.checks import vllm_importable
from lorarl.gpucheck.main import VLLM_CHECKS
from lorarl.gpucheck.shapes import ARCHS, twins
from tests import test_gpucheck

pytestmark = pytest.mark.vllm_real


def test_cpu_smoke_runs_every_vllm_check_for_real(tmp_path):
    assert vllm_importable() is None  # gpucheck.main then adds the vLLM twin's doctor and the vLLM jobs' rows
    for twin in twins("cpu-smoke"):
        a = ARCHS[twin.arch]
        assert (a.head_dim or a.hidden // a.heads) >= 32, twin.arch  # vLLM's CPU attention refuses head_dim 16
    test_gpucheck.test_cpu_smoke_runs_every_check_for_real(tmp_path)  # the main venv's assertions, vLLM branch
    res = json.loads((tmp_path / "gpucheck.json").read_text())
    rows = {r["check"]: r for r in res["checks"]}
    assert not set(VLLM_CHECKS[:2]) & set(rows)  # the vLLM twin's rows replace the placeholders of a missing vllm
    vllm_rows = [r for name, r in rows.items() if name.endswith("(vLLM)")]
    names = {r["check"] for r in vllm_rows}
    assert {"doctor: reward_density (vLLM)", "freshness gap: reward_density (vLLM)",
            "evaluation tokens/s: reward_density (vLLM)"} <= names, names
    for r in vllm_rows + [rows["merged-weight push time"], rows["multi-LoRA pack sampling"]]:
        assert r["status"] == "pass", r
