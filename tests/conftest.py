"""Test-wide hygiene shared by every test module."""

import os

import pytest


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
