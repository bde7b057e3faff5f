"""The vLLM evaluation backend on vLLM's real CPU engine (issue: evaluation through vLLM for real): one engine
serves every snapshot of a job, as LoRA requests and as merged-weight pushes, greedy answers equal the HF
backend's problem by problem on the same snapshots, and sampled pass@k replays run to run with each problem
drawing its own noise."""

from __future__ import annotations

import pytest
import vllm  # noqa: F401 - a venv built for these tests without vllm must fail here, not skip

from lorarl.evaluate.backends import HFBackend
from lorarl.grading.protocols import Protocol
from lorarl.evaluate.vllm_backend import VLLMBackend
from real_engine import restore_base, shared

pytestmark = pytest.mark.vllm_real

PROBLEMS = ["Q: 12+7=?\nA: ", "Q: 3-1=?\nA: ", "Q: 45+45-9=?\nA: ", "Q: 8+8=?\nA: ", "Q: 90-4=?\nA: "]
GREEDY = Protocol.greedy(max_new_tokens=12)


def _answers(backend, protocol=GREEDY, seed=0, problems=PROBLEMS):
    return [[(c.text, c.n_tokens, c.truncated) for c in req] for req in backend.generate(problems, protocol, seed)]


def _hf(paths, adapter):
    return _answers(HFBackend(paths["base"], paths[adapter] if adapter else None))


def test_lora_snapshots_as_requests_equal_hf_problem_by_problem():
    s = shared()
    p = s.paths
    plan = [(p["base"], p["lora"]), (p["base"], p["lora2"]), (p["base"], None)]
    backend = VLLMBackend(p["base"], p["lora"], plan=plan, api=s.api, llm=s.llm)
    assert backend.mode == "lora"
    got = {}
    for _, adapter in plan:
        backend.select(p["base"], adapter)
        got[adapter.name if adapter else None] = _answers(backend)
    assert backend.lora_ids == {str(p["lora"]): 1, str(p["lora2"]): 2} and backend.llm is s.llm
    for name in ("lora", "lora2", None):
        assert got[name] == _hf(p, name), name  # every problem: text, length, truncation
    assert got["lora"] != got[None] and got["lora2"] != got[None]  # the adapters were applied


def test_snapshots_pushed_as_merged_weights_equal_hf_problem_by_problem(tmp_path):
    s = shared()
    p = s.paths
    plan = [(p["base"], p["dora"]), (p["base"], p["lora"]), (p["base"], None)]
    backend = VLLMBackend(p["base"], p["dora"], plan=plan, merge_dir=tmp_path / "dora", api=s.api, llm=s.llm)
    try:
        assert backend.mode == "merged" and "DoRA" in backend.merged_from
        got = {"dora": _answers(backend)}
        backend.select(p["base"], p["lora"], tmp_path / "lora")
        got["lora"] = _answers(backend)
        backend.select(p["base"], None)
        got[None] = _answers(backend)
        assert backend.pushes == 3  # every set pushed into the one engine (vLLM's CPU build: reload_weights)
        for name in ("dora", "lora", None):
            assert got[name] == _hf(p, name), name
        assert got["dora"] != got[None] != got["lora"]
    finally:
        restore_base(s)


def test_sampled_pass_at_k_replays_and_draws_independent_noise_per_problem():
    s = shared()
    backend = VLLMBackend(s.paths["base"], api=s.api, llm=s.llm)
    protocol = Protocol.sampling(4, temperature=1.0, max_new_tokens=8)
    same = [PROBLEMS[0]] * 3  # one problem at three positions
    first = _answers(backend, protocol, seed=5, problems=same)
    assert all(len(req) == 4 for req in first)
    assert first[0] != first[1] and first[1] != first[2] and first[0] != first[2]  # independent across problems
    assert len({c for c in first[0]}) > 1  # the samples of one problem differ too
    assert _answers(backend, protocol, seed=5, problems=same) == first  # run to run: the cell seed replays
    assert _answers(backend, protocol, seed=6, problems=same) != first
    mixed = _answers(backend, protocol, seed=5, problems=[PROBLEMS[1], PROBLEMS[0]])
    assert mixed[1] == first[1]  # a problem's samples depend on its position and the seed, not on its neighbours


def test_the_engines_max_model_len_bounds_each_prompts_budget():
    """The backend reads the real engine's context (llm_engine.model_config.max_model_len: 256 here) and refuses a
    prompt whose max_new_tokens would run past it, before vLLM generates (which would stop it short as if spent)."""
    s = shared()
    backend = VLLMBackend(s.paths["base"], None, api=s.api, llm=s.llm)
    assert s.llm.llm_engine.model_config.max_model_len == 256
    longest = max(len(i["prompt_token_ids"]) for i in backend._inputs(PROBLEMS))
    backend.check_budget(PROBLEMS, Protocol.greedy(max_new_tokens=256 - longest))
    with pytest.raises(ValueError, match=f"a prompt of {longest} tokens \\+ max_new_tokens {257 - longest} exceeds"):
        backend.check_budget(PROBLEMS, Protocol.greedy(max_new_tokens=257 - longest))
