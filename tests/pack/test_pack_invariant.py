"""``runtime.batch_invariant`` (lorarl.numerics.invariant, docs/packed.md): never in a signature; in a pack every
rollout, forward and backward holds one member's rows only (its pack-of-one shapes), and vLLM engines start with
vLLM's own batch-invariant switch. That a member so trained equals its solo run: tests/pack/test_solo_pack.py (KNOBS)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.support import fake_vllm


def _invariant(c, on: bool = True, **sections):
    from lorarl.language.config import CellConfig

    d = c.config.model_dump()
    return SimpleNamespace(id=c.id, config=CellConfig(**{**d, **sections, "runtime": {**d["runtime"],
                                                                                         "batch_invariant": on}}))


def test_batch_invariant_is_runtime_only(tiny_dir):
    from lorarl.language.signature import signature_dump, signatures
    from tests.support.pack_steps import cell

    c = cell(tiny_dir, "a", 1)
    on = _invariant(c)
    assert on.config.runtime.batch_invariant and not c.config.runtime.batch_invariant
    assert signatures(on.config)[1:] == signatures(c.config)[1:]  # training and evaluation signatures alike
    assert "batch_invariant" not in str(signature_dump(on.config))


@pytest.mark.parametrize("on", [True, False])
def test_each_forward_of_an_invariant_pack_holds_one_members_rows(tiny_dir, tmp_path, on):
    """Rollouts, the update, the no-grad policy forwards (KL monitors) and the reference forward: with the mode on
    each routed call carries one member's rows and each reference forward at most one member's P x G rows; off,
    the pack's calls mix both members (what the check would miss if it saw nothing)."""
    from lorarl.pack.build import build_pack
    from tests.support.pack_steps import cell, fake_regimes

    cells = [_invariant(cell(tiny_dir, "a", 1, beta=0.05, monitor=1, steps=1), on),
             _invariant(cell(tiny_dir, "b", 2, beta=0.05, monitor=1, steps=1, rank=8, alpha=16), on)]
    pack = fake_regimes(build_pack(cells, results_dir=tmp_path, device="cpu"))
    router, routed, ref_rows = pack.loop.trainer.router, [], []
    route = router.route
    router.route = lambda sizes: (routed.append(list(sizes)), route(sizes))[1]
    pack.loop.ref.get_input_embeddings().register_forward_hook(lambda m, i, o: ref_rows.append(i[0].size(0)))
    rows = pack.loop.step()
    assert set(rows) == {"a", "b"} and all("kl_new_old" in r for r in rows.values())
    members_per_call = [sum(1 for n in sizes if n) for sizes in routed]
    assert routed and ref_rows
    if on:
        assert max(members_per_call) == 1 and max(ref_rows) == 2 * 2, (routed, ref_rows)
    else:
        assert max(members_per_call) == 2 and max(ref_rows) == 2 * 2 * 2, (routed, ref_rows)


def test_vllm_engines_start_batch_invariant_and_are_not_reused_across_the_switch(monkeypatch):
    """The switch is in the environment when ``LLM`` is built (vLLM reads it then); the process's engine built
    without it is not reused for a pack that asks for it."""
    from lorarl.numerics.invariant import VLLM_FLAG, vllm_engine_env, vllm_on
    from lorarl.pack import vllm_rollouts

    monkeypatch.setenv(VLLM_FLAG, "0")  # the test's own start (restored after it)
    monkeypatch.setattr(vllm_rollouts, "_ENGINE", {})
    seen = []

    class LLM:
        def __init__(self, model, **kw):
            seen.append(os.environ.get(VLLM_FLAG))

    api, kw = SimpleNamespace(LLM=LLM), {"max_lora_rank": 8, "max_loras": 2}
    vllm_engine_env(False)
    first = vllm_rollouts.pack_engine(api, "m", kw)
    assert vllm_rollouts.pack_engine(api, "m", kw) is first and seen == ["0"] and not vllm_on()
    vllm_engine_env(True)
    second = vllm_rollouts.pack_engine(api, "m", kw)
    assert second is not first and seen == ["0", "1"] and vllm_on()
    assert vllm_rollouts.pack_engine(api, "m", kw) is second


def test_a_vllm_pack_asking_for_it_samples_on_a_batch_invariant_engine(tiny_dir, tmp_path, monkeypatch):
    from lorarl.evaluate import vllm_backend
    from lorarl.pack import vllm_rollouts
    from lorarl.pack.build import build_pack
    from tests.support.pack_steps import cell, fake_regimes

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    fake_vllm.fresh_process()
    monkeypatch.setattr(vllm_backend, "_vllm_api", lambda: fake_vllm.api())
    monkeypatch.setattr(vllm_rollouts, "_ENGINE", {})
    rollout = {"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True}
    cells = [_invariant(cell(tiny_dir, "a", 1, steps=1), rollout=rollout),
             _invariant(cell(tiny_dir, "b", 2, steps=1, rank=8, alpha=16), False, rollout=rollout)]  # one asks
    pack = fake_regimes(build_pack(cells, results_dir=tmp_path, device="cpu"))
    assert pack.loop.rollouts.llm.batch_invariant and pack.loop.trainer.batch_invariant
    assert set(pack.loop.step()) == {"a", "b"}


def test_a_gpu_trainer_takes_vllms_batch_invariant_kernels_once(monkeypatch):
    """On CUDA (faked here: vLLM's module and torch's switch stand-ins) the mode turns vLLM's switch on, applies its
    kernels and torch's deterministic algorithms, once per process; on a CPU or when off it does nothing."""
    import sys
    import types

    import torch

    from lorarl.numerics import invariant

    calls = []
    vbi = types.ModuleType("vllm.model_executor.layers.batch_invariant")
    vbi.init_batch_invariance = lambda: calls.append(("vllm", os.environ.get(invariant.VLLM_FLAG)))
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setattr(sys.modules["vllm.model_executor.layers"], "batch_invariant", vbi, raising=False)
    monkeypatch.setitem(sys.modules, vbi.__name__, vbi)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, warn_only: calls.append(("torch", on)))
    monkeypatch.setattr(invariant, "_APPLIED", [])
    monkeypatch.setenv(invariant.VLLM_FLAG, "0")
    assert invariant.trainer_kernels(True, "cpu") == [] and invariant.trainer_kernels(False, "cuda") == [] and not calls
    got = invariant.trainer_kernels(True, "cuda")
    assert got == ["vLLM's batch-invariant kernels", "torch deterministic algorithms"]
    assert calls == [("vllm", "1"), ("torch", True)]
    assert invariant.trainer_kernels(True, "cuda") == got and len(calls) == 2  # once per process
