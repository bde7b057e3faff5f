"""``rollout.engine: vllm`` cells pack (lorarl.pack.vllm_rollouts), against tests/support/fake_vllm.py: one engine per process
serves every member's adapter (max_lora_rank = the largest saved rank, max_loras = members), each step hands every
member's adapter over once and makes ONE generate call carrying the sampled tokens' logprobs back, and a packed
member trains as its solo vLLM run (a pack of one on the same engine). The real CPU engine runs the same in
tests/vllm_real/test_pack_vllm_real.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import fake_vllm

ROLLOUT = {"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True}


def vllm_cell(tiny_dir, cid, seed, **kw):
    from lorarl.language.config import CellConfig
    from tests.support.pack_steps import cell

    c = cell(tiny_dir, cid, seed, steps=2, **kw)
    return SimpleNamespace(id=cid, config=CellConfig(**{**c.config.model_dump(), "rollout": ROLLOUT}))


@pytest.fixture
def fake_engine(monkeypatch):
    from lorarl.evaluate import vllm_backend
    from lorarl.pack import vllm_rollouts

    fake_vllm.fresh_process()
    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)
    monkeypatch.setattr(vllm_backend, "_vllm_api", lambda: fake_vllm.api())
    monkeypatch.setattr(vllm_rollouts, "_ENGINE", {})
    return vllm_rollouts


def test_vllm_cells_train_in_one_engine_one_call_per_step_as_alone(tiny_dir, tmp_path, fake_engine, capsys):
    from lorarl.pack.build import build_pack
    from tests.support.pack_mixed_ranks import assert_pack_equals_solo
    from tests.support.pack_steps import fake_regimes

    cells = [vllm_cell(tiny_dir, "a", 1, rank=1, alpha=2), vllm_cell(tiny_dir, "b", 2, rank=8, alpha=4, beta=0.05,
                                                                     temperature=0.7)]
    pack = fake_regimes(build_pack(cells, results_dir=tmp_path, device="cpu"))
    llm = pack.loop.rollouts.llm
    assert (llm.kwargs["max_lora_rank"], llm.kwargs["max_loras"]) == (8, 2) and llm.kwargs["enable_lora"]
    assert llm.kwargs["distributed_executor_backend"] == "external_launcher" and llm.kwargs["dtype"] == "float32"
    assert not pack.loop.rollouts.memory and ("adapters handed to vLLM through disk each step (a folder per member; "
                                              "the in-memory path is not available: LLM has no collective_rpc"
                                              ) in capsys.readouterr().out  # the fake: disk, said in the log
    rows = [pack.loop.step() for _ in range(2)]
    assert llm.generate_calls == 2 and llm.adapter_loads == 2 * 2  # one call per step, each adapter once per step
    assert len(llm.llm_engine.list_loras()) == 2  # the previous step's adapters were removed
    for r in rows:
        assert set(r) == {"a", "b"} and all(r[n]["rollout/logp_diff_max"] < 1e-4 for n in r), r
    # the same cells again: a fresh pack, then each member alone, on the process's one engine (the fake refuses a
    # second LLM, as a GPU does); a new pack removes the old one's adapters and never reuses an adapter id
    assert_pack_equals_solo(cells, tmp_path, steps=2, tol=1e-6)
    assert fake_engine._ENGINE["llm"] is llm and len(fake_vllm.LLM.instances) == 1
    assert llm.lorarl_last_lora_id == 2 * 2 + 2 * 2 + 2 * 2  # 4 pack handovers of 2, then 2 + 2 solo ones


def test_the_process_engine_is_reused_only_where_it_covers_the_pack(tiny_dir):
    from lorarl.pack.vllm_rollouts import _covers, engine_args

    cfg = vllm_cell(tiny_dir, "a", 1).config
    kw = engine_args(cfg, {"enable_lora": True, "max_loras": 3, "max_lora_rank": 32, "max_cpu_loras": 3})
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enforce_eager"] and kw["gpu_memory_utilization"] == 0.15
    small = {**kw, "max_loras": 1, "max_lora_rank": 8}
    assert _covers(kw, small) and not _covers(small, kw)  # a 3-adapter rank-32 engine serves a pack of one
    assert not _covers(kw, {**kw, "logprobs_mode": "raw_logprobs"}) and not _covers(kw, {**kw, "dtype": "bfloat16"})
