"""Real-engine tests: vLLM's own CPU build (vllm-cpu 0.31.0) in .venv-vllm (scripts/vllm_cpu.sh), marker vllm_real.

tests/conftest.py collects this folder where vllm is importable or where ``LORARL_VLLM_REAL=1`` asks for it
(scripts/test.sh sets it for its run in .venv-vllm). Asked for and vllm missing: every test here FAILS with the
reason (never a skip), so a broken install cannot pass CI quietly.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# vLLM's CPU backend: the KV cache is VLLM_CPU_KVCACHE_SPACE GiB (integer); an engine per trained cell lives
# in this one process (vLLM does not free an engine on ``del``), so each takes the smallest, 1 GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.vllm_real)


@pytest.fixture(autouse=True, scope="session")
def _vllm_present():
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("tests/vllm_real needs vLLM's CPU build and vllm is not importable in this venv "
                    f"({os.sys.prefix}): build .venv-vllm with `bash scripts/vllm_cpu.sh` and run "
                    "`.venv-vllm/bin/python -m pytest -m vllm_real tests/vllm_real`", pytrace=False)
