"""tests/support/fake_vllm.py's contract: each behaviour the fake models (its refusals, seeds of n > 1 children, logprob
modes, adapter reads, the weight paths) run as the same scenario against the fake and against vLLM's real CPU
engine (tests/vllm_real/scenarios.py), with the same outcome. The fake's one-engine-per-process refusal models the
GPU build's startup memory check: the CPU build builds a second in-process engine whenever host memory holds both
KV caches (the last test here does), so no CPU scenario can show that refusal."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing

import pytest
import vllm

from tests.support import fake_vllm
from tests.support import fake_vllm_fields as fields
import scenarios
from real_engine import ENGINE_KWARGS, shared

pytestmark = pytest.mark.vllm_real


def _fake_engine(s, **overrides):
    fake_vllm.fresh_process()
    api = fake_vllm.api()
    kw = {**ENGINE_KWARGS, **overrides, "distributed_executor_backend": "external_launcher"}
    return api.LLM(model=str(s.paths["base"]), **kw), api


def test_the_fakes_field_lists_are_vllms():
    from vllm.config.lora import MaxLoRARanks
    from vllm.config.model import LogprobsMode
    from vllm.engine.arg_utils import EngineArgs

    assert fields.LLM_PARAMS == set(inspect.signature(vllm.LLM.__init__).parameters) - {"self", "model", "kwargs"}
    assert fields.ENGINE_ARGS <= {f.name for f in dataclasses.fields(EngineArgs)}
    assert fields.SAMPLING_FIELDS == {f for f in vllm.SamplingParams.__struct_fields__ if not f.startswith("_")}
    assert fields.MAX_LORA_RANKS == typing.get_args(MaxLoRARanks)
    assert set(fields.LOGPROBS_MODES) == set(typing.get_args(LogprobsMode))


def test_refusals_are_vllms():
    s = shared()
    model = str(s.paths["base"])
    real = scenarios.refusals(s.api, model)
    assert "accepted" not in real.values(), real
    fake_vllm.fresh_process()
    assert scenarios.refusals(fake_vllm.api(), model) == real
    fake, api = _fake_engine(s)
    assert scenarios.list_length_refusal(fake, api, s.tokenizer) == scenarios.list_length_refusal(
        s.llm, s.api, s.tokenizer) == "VLLMValidationError"


def test_seeds_of_n_children_are_vllms():
    s = shared()
    real = scenarios.child_seeds(s.llm, s.api, s.tokenizer)
    fake = scenarios.child_seeds(*_fake_engine(s), s.tokenizer)
    for got in (real, fake):
        assert got["fan"] == got["kids"]  # child j of a seeded n > 1 request samples as seed + j
        assert got["shared"][0] == got["shared"][1]  # one seeded SamplingParams: every prompt the same stream
        assert len({json.dumps(x) for x in got["fan"]}) > 1


def test_processed_logprobs_are_vllms():
    s = shared()
    real = scenarios.sampled_logprobs(s.llm, s.api, s.tokenizer, str(s.paths["base"]))
    fake = scenarios.sampled_logprobs(*_fake_engine(s), s.tokenizer, str(s.paths["base"]))
    for got in (real, fake):  # processed_logprobs (TRL's): after temperature, top-k and top-p, renormalised
        assert got["processed_gap"] < 1e-4 < got["raw_gap"] and got["sampled_in_kept_set"], got


def test_adapter_reads_are_vllms(monkeypatch):
    s = shared()
    manager = s.llm.llm_engine.model_executor.driver_worker.model_runner.lora_manager
    calls = []
    load = manager._load_adapter
    monkeypatch.setattr(manager, "_load_adapter", lambda req: calls.append(req.lora_int_id) or load(req))
    real = scenarios.adapter_reads(s.llm, s.api, s.tokenizer, s.paths, lambda: len(calls))
    fake, api = _fake_engine(s)
    assert scenarios.adapter_reads(fake, api, s.tokenizer, s.paths, lambda: fake.adapter_loads) == real
    assert real["first"] == 1 and real["again"] == 0 and real["inplace"] > 1, real


def test_raw_logprobs_weight_paths_and_lora_refusal_are_vllms():
    """A second engine in this process (the CPU build holds one per KV cache that fits; the fake refuses it, as
    vLLM's GPU startup memory check does): vLLM's default mode (raw_logprobs), no LoRA. Its sampled tokens'
    logprobs are the raw log-softmax; the CPU build's model.load_weights cannot reach a linear layer; a LoRA
    request is refused."""
    import torch

    from lorarl.evaluate.vllm_backend import inprocess_engine_kwargs

    s = shared()
    kw = {k: v for k, v in ENGINE_KWARGS.items() if k not in ("enable_lora", "max_lora_rank", "max_loras", "logprobs_mode")}
    llm = s.api.LLM(model=str(s.paths["base"]), **kw, **inprocess_engine_kwargs())
    real = scenarios.sampled_logprobs(llm, s.api, s.tokenizer, str(s.paths["base"]))
    assert real["raw_gap"] < 1e-4 < real["processed_gap"], real
    fake_llm, api = _fake_engine(s, logprobs_mode="raw_logprobs", enable_lora=False)
    fake = scenarios.sampled_logprobs(fake_llm, api, s.tokenizer, str(s.paths["base"]))
    assert fake["raw_gap"] < 1e-4 < fake["processed_gap"], fake
    q = [("model.layers.0.self_attn.q_proj.weight", torch.zeros(64, 64))]
    fake_vllm.api(cpu=True)
    for engine in (llm, fake_llm):
        with pytest.raises(AttributeError, match="weight_loader"):
            engine.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(q)
    for engine, a in ((llm, s.api), (fake_llm, api)):
        lora = a.LoRARequest("x", 1, str(s.paths["lora"]))
        assert scenarios.outcome(lambda: engine.generate([scenarios.prompt_ids(s.tokenizer)], a.SamplingParams(
            max_tokens=2), use_tqdm=False, lora_request=lora)) == "VLLMValidationError"
