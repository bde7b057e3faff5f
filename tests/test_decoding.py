"""The HF generation engine (runtime.generation, lorarl.decoding): the setting is validated and never in a
signature; ``auto`` and the fallbacks resolve as documented; a static KV cache gives the same tokens as the
dynamic cache in HF evaluation, greedy and seeded sampling (training and packed rollouts, through lorarl's row
sampler: tests/train/test_rowsample.py). The compiled decode step is checked for the same tokens by
bench/generation_speed.py: compiling on this CPU takes minutes, too long for CI."""

from __future__ import annotations

import pytest
import torch

from lorarl.decoding import EnginePlan, GenerationEngine, apply, plan
from tests.support.tiny_model import used_static

STATIC, DYNAMIC = GenerationEngine(cache="static"), GenerationEngine(cache="dynamic")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.support.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture()
def fresh_messages(monkeypatch):
    import lorarl.decoding

    monkeypatch.setattr(lorarl.decoding, "_SAID", set())


def small_model(cls=None):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32)
    return (cls or Qwen2ForCausalLM)(cfg)


def test_auto_resolves_by_device_and_the_fallbacks_are_said_once(fresh_messages, capsys):
    from transformers import Qwen2ForCausalLM

    m = small_model()
    assert plan(None, m, "cpu") == EnginePlan(static=False, compiled=False)  # measured: dynamic on the CPU
    assert plan(GenerationEngine(), m, "cuda") == EnginePlan(static=True, compiled=True)
    assert plan(STATIC, m, "cpu") == EnginePlan(static=True, compiled=False)
    assert plan(GenerationEngine(compile="on"), m, "cpu") == EnginePlan(static=True, compiled=True)
    assert plan(GenerationEngine(compile="off"), m, "cuda") == EnginePlan(static=False, compiled=False)
    assert capsys.readouterr().err == ""  # nothing fell back
    for _ in range(2):
        assert plan(GenerationEngine(cache="dynamic", compile="on"), m, "cpu") == EnginePlan(False, False)
    assert capsys.readouterr().err.count("compile 'on' needs cache 'static'") == 1  # once per process
    assert plan(GenerationEngine(compile="on"), m, "cuda", routed=True) == EnginePlan(static=True, compiled=False)
    assert "packed rollouts" in capsys.readouterr().err

    class Uncompilable(Qwen2ForCausalLM):
        _can_compile_fullgraph = False

    class OwnCache(Qwen2ForCausalLM):
        @classmethod
        def _supports_default_dynamic_cache(cls):
            return False

    assert plan(GenerationEngine(compile="on"), small_model(Uncompilable), "cpu") == EnginePlan(True, False)
    assert "Uncompilable does not declare a compilable forward" in capsys.readouterr().err
    assert plan(STATIC, small_model(OwnCache), "cuda") == EnginePlan(static=False, compiled=False)
    assert "OwnCache keeps its own cache" in capsys.readouterr().err


def test_apply_sets_the_generation_config():
    from transformers import GenerationConfig

    cfg = apply(GenerationConfig(), EnginePlan(static=True, compiled=True), "cpu")
    assert cfg.cache_implementation == "static" and not cfg.disable_compile
    assert cfg.compile_config._compile_all_devices  # transformers compiles on a CPU only when flagged
    cfg = apply(GenerationConfig(), EnginePlan(static=False, compiled=False), "cuda")
    assert cfg.cache_implementation is None and cfg.disable_compile and cfg.compile_config is None


def test_the_setting_is_runtime_and_a_bad_value_is_named():
    from lorarl.language.config import CellConfig
    from lorarl.language.signature import train_signature
    from lorarl.language.study import StudyError, parse_study, study_cells

    assert train_signature(CellConfig()) == train_signature(CellConfig(runtime={"generation": {"cache": "static",
                                                                                               "compile": "on"}}))
    with pytest.raises(StudyError) as err:
        study_cells(parse_study({"name": "s", "defaults": {"runtime": {"generation": {"cache": "paged"}}}}))
    msg = str(err.value)
    assert "runtime.generation.cache" in msg and all(v in msg for v in ("'auto'", "'static'", "'dynamic'"))



def test_evaluation_static_cache_gives_the_same_tokens(tiny_dir):
    from lorarl.evaluate.backends import HFBackend
    from lorarl.grading.protocols import Protocol

    prompts = [f"Q: {i}+{2 * i}=?" + " x" * (i % 4) for i in range(6)]  # uneven widths: left padding
    greedy = Protocol(kind="greedy", max_new_tokens=12)
    sample = Protocol(kind="sample", temperature=1.0, top_p=0.95, max_new_tokens=12, n=2)
    backends = {e.cache: HFBackend(tiny_dir, device="cpu", batch_size=4, generation=e) for e in (DYNAMIC, STATIC)}
    for proto in (greedy, sample):
        got = {k: b.generate(prompts, proto, seed=3) for k, b in backends.items()}
        assert got["static"] == got["dynamic"], proto.kind
    assert len({c.text for r in got["static"] for c in r}) == 12  # distinct samples: the comparison can fail
    assert used_static(backends["static"].model) and not used_static(backends["dynamic"].model)
