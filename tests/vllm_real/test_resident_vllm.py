"""A resident pack on vLLM's real CPU engine: one multi-LoRA engine with ``max_loras = places`` serves every re-formed
pack of the job; the adapters of members that leave are evicted and the newcomers' admitted (``remove_lora`` /
``add_lora``, or from memory) without restarting the engine, never more than ``places`` at once between steps; every cell (mixed ranks, unequal
lengths) ends equal to its solo vLLM run on the same engine (tests/pack/test_resident.py's check: metrics and adapter
to 1e-6, which holds the rollout tokens' rewards and log-probs; vLLM's near-ties would show as a difference here,
none happens on this engine)."""

from __future__ import annotations

import json

import pytest

from tests.support.pause import outputs
from tests.support.resident import assert_equal_runs, published, solo_runs
from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study

pytestmark = pytest.mark.vllm_real

ROLLOUT = {"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """tests/train/test_grpo.py's tiny model and tokenizer, at head_dim 32 (vLLM's CPU attention refuses 16)."""
    from tests.support.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny32"), hidden=64, intermediate=128)


def vllm_cells(tmp_path, model_dir):
    from lorarl.language.study import cell_table, load_study

    doc = tiny_study("rz", model=model_dir, **IN_PROCESS, eval=None, rollout=ROLLOUT,
                     train={**IN_PROCESS_TRAIN, "checkpoint_every": 0, "kl_monitor_every": 2},
                     axes={"length": {"field": "train.steps", "prefix": "n", "values": [2, 4]},
                           "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 8]}})
    p = write_study(tmp_path / "rz.yaml", doc)
    return {(c.config.adapter.rank, c.config.train.steps): c for c in cell_table(load_study(str(p))).cells}


def test_a_resident_vllm_job_admits_and_evicts_adapters_on_one_engine(model_dir, tmp_path, fake_rewards, monkeypatch):
    from lorarl.pack import vllm_rollouts
    from lorarl.pack.multilora import EngineAdapters
    from lorarl.pack.resident import engine_for, train_resident

    cells = vllm_cells(tmp_path, model_dir)
    order = [cells[k] for k in ((1, 2), (8, 4), (8, 2), (1, 4))]
    ids = [c.id for c in order]
    res, ref = tmp_path / "res", tmp_path / "ref"
    vllm_rollouts._ENGINE.clear()  # this job builds its engine: max_loras = places
    llm = engine_for(order, 2, res)
    assert type(llm).__module__.startswith("vllm.")
    engine, seen = llm.llm_engine, {"adds": [], "removes": 0, "most": 0}
    update, remove = EngineAdapters.update, engine.remove_lora

    def counted_update(this, adapters):  # a step's adapters in (from memory), the previous step's out
        out = update(this, adapters)
        seen["adds"] += [r.lora_name.split("@")[0] for r in out]
        seen["most"] = max(seen["most"], len(engine.list_loras()))
        return out

    def counted_remove(i):
        seen["removes"] += 1
        return remove(i)

    monkeypatch.setattr(EngineAdapters, "update", counted_update)
    monkeypatch.setattr(engine, "remove_lora", counted_remove)
    out = train_resident("rz", order, res, places=2, resident_id="pack-vllm")
    segs = json.loads((res / "rz" / ".packs" / "pack-vllm.ledger.json").read_text())["segments"]
    assert [s["admitted"] for s in segs] == [ids[:2], ids[1:3], ids[3:]]  # the short ones leave at 2: re-formed
    assert out["trained"] == sorted(ids)
    assert vllm_rollouts._ENGINE["llm"] is llm  # never restarted: every re-formed pack sampled on it
    assert seen["most"] <= 2 and seen["removes"] > 0  # at most `places` adapters held between steps; evicted
    assert set(ids) <= set(seen["adds"])  # every newcomer admitted
    published(res, order)
    solo = solo_runs(ref, order)  # each cell alone, on the same engine (max_loras 2 holds a pack of one)
    assert vllm_rollouts._ENGINE["llm"] is llm
    for c in order:
        assert_equal_runs(outputs(res / "rz" / c.id), outputs(ref / "rz" / c.id), resumed_from=None,
                          steps=solo[c.id]["steps"])
