"""Test-wide hygiene shared by every test module."""

import importlib.util
import os

import pytest

# tests/vllm_real runs vLLM's real CPU engine (marker vllm_real; .venv-vllm, scripts/vllm_cpu.sh). Collected where
# vllm is importable, or where LORARL_VLLM_REAL=1 asks for it (CI's run in .venv-vllm: there a missing vllm
# fails the run, tests/vllm_real/conftest.py); in the main CPU venv, which never holds vllm, it is left out.
REAL_VLLM_WANTED = os.environ.get("LORARL_VLLM_REAL") == "1" or importlib.util.find_spec("vllm") is not None
collect_ignore = [] if REAL_VLLM_WANTED else ["vllm_real"]
# session fixtures that many modules start from, built once (tests/support/trained.py: the tiny-test base model)
pytest_plugins = ["support.trained"]


@pytest.fixture(autouse=True)
def _restore_environ():
    """Give every test the environment it started with.

    TRL's colocated vLLM path (tests/test_rollout.py drives it with a fake engine) sets RANK,
    LOCAL_RANK and WORLD_SIZE in os.environ. Leaked into a later test, they reach every subprocess it
    starts: accelerate then treats each CPU trainer as a distributed rank and two concurrent cells
    race for port 29500.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _fresh_fake_vllm_process():
    """One test, one process as far as tests/fake_vllm.py knows: it refuses a second engine in a process
    (vLLM does not free an engine's memory on ``del``), so the engines a test built are forgotten after it."""
    import sys

    yield
    for name in ("fake_vllm", "tests.fake_vllm"):
        mod = sys.modules.get(name)
        if mod is not None:
            mod.LLM.instances = []
