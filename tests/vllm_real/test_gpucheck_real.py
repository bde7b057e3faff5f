"""`python -m lorarl.gpucheck --cpu-smoke` where vLLM's CPU build is installed runs its vLLM checks for real: vllm
imports (no "not run: vllm not importable" rows), the --cpu-smoke twins have shapes vLLM's CPU kernels take, and the
merged-weight push and multi-LoRA pack sampling jobs pass on the real engine (run here in-process: the CPU build
holds several engines in one process)."""

from __future__ import annotations

import pytest

from lorarl.gpucheck.checks import multilora_row, push_row, vllm_importable
from lorarl.gpucheck.shapes import ARCHS, build_model, twins
from lorarl.gpucheck.vllmjob import multilora_check, push_check
from real_engine import real_api

pytestmark = pytest.mark.vllm_real


def test_cpu_smoke_twins_run_their_vllm_checks_for_real(tmp_path):
    assert vllm_importable() is None  # gpucheck.main then adds the vLLM twin's doctor and the vLLM jobs' rows
    for twin in twins("cpu-smoke"):
        a = ARCHS[twin.arch]
        assert (a.head_dim or a.hidden // a.heads) >= 32, twin.arch  # vLLM's CPU attention refuses head_dim 16
    twin = next(t for t in twins("cpu-smoke") if t.study == "reward_density")  # the twin gpucheck runs vLLM on
    build_model(twin.arch, tmp_path / "m", "cpu")
    api = real_api()
    assert api.cpu
    rank, alpha = twin.cell["adapter"]["rank"], twin.cell["adapter"]["alpha"]
    push = push_row(push_check(api, str(tmp_path / "m"), rank, alpha, tokens=8))
    assert push["status"] == "pass", push  # the pushed LoRA is what the engine samples (freshness gap)
    multi = multilora_row(multilora_check(api, str(tmp_path / "m"), rank, alpha, str(tmp_path / "w"), tokens=8))
    assert multi["status"] == "pass", multi  # each member sampled its own adapter, P x G rows each
