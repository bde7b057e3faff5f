"""A cell leaves a vLLM pack and comes back equal, on vLLM's real CPU engine (tests/train/test_cell_leaves.py's check with
``rollout.engine: vllm``: one in-process multi-LoRA engine serves every pack of the process).

The rank-8 member (alpha 4) trains beside a rank-1 member, leaves at step 2 with its state (weights by name, AdamW,
schedule, data order, the sampling generator its requests' seeds come from, monitors), and comes back at position 2
of a pack with a rank-32 and another rank-1 member. Its rows (1e-6), its rollout token ids at every step and its
final adapter (1e-6) equal its solo vLLM run's (a pack of one on the same engine). Its requests carry the same seeds
alone or packed; vLLM does not promise batch invariance, so a token could flip where two logits tie: such a flip
would show as a token difference here (the pack tests' near-tie counting, test_pack_vllm_real.py, is for greedy
rows); on this engine none happens.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm_real

ROLLOUT = {"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """tests/train/test_grpo.py's tiny model and tokenizer, at head_dim 32 (vLLM's CPU attention refuses 16)."""
    from tests.support.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny32"), hidden=64, intermediate=128)


def _vllm(c):
    from lorarl.language.config import CellConfig

    return SimpleNamespace(id=c.id, config=CellConfig(**{**c.config.model_dump(), "rollout": ROLLOUT}))


def test_a_vllm_member_leaves_a_pack_and_comes_back_in_another_position(model_dir, tmp_path):
    from lorarl.pack import vllm_rollouts
    from lorarl.pack.build import build_pack
    from tests.support.pack_mixed_ranks import mixed_rank_cells
    from tests.support.cell_leaves import STEPS, assert_leaves_and_comes_back_equal
    from tests.support.pack_steps import cell

    r1, r8, r32 = (_vllm(c) for c in mixed_rank_cells(model_dir, steps=STEPS))
    other_r1 = _vllm(cell(model_dir, "r1b", 7, beta=0.05, lr=2e-2, rank=1, alpha=2.0, steps=STEPS))
    if not vllm_rollouts._ENGINE or vllm_rollouts._ENGINE["model"] != model_dir:  # one engine for every pack here
        build_pack([r1, r8, r32], results_dir=tmp_path / "engine", device="cpu")  # max_loras 3, max_lora_rank 32
    llm = vllm_rollouts._ENGINE["llm"]
    assert type(llm).__module__.startswith("vllm.")
    assert_leaves_and_comes_back_equal(r8, [r1], [r32, other_r1], first_at=1, second_at=2, tmp_path=tmp_path)
    assert vllm_rollouts._ENGINE["llm"] is llm  # the solo run and both packs sampled on the one engine
