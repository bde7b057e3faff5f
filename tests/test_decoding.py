"""The HF generation engine (runtime.generation, lorarl.decoding): the setting is validated and never in a
signature; ``auto`` and the fallbacks resolve as documented; a static KV cache gives the same tokens as the
dynamic cache, greedy and through lorarl's row sampler, for training rollouts, packed rollouts and HF evaluation.
(The compiled decode step is checked for the same tokens by bench/generation_speed.py: compiling on this CPU
takes minutes, too long for CI.)"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from lorarl.decoding import EnginePlan, GenerationEngine, apply, plan

STATIC, DYNAMIC = GenerationEngine(cache="static"), GenerationEngine(cache="dynamic")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.tiny_model import save_tiny

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
    from lorarl.config import CellConfig
    from lorarl.signature import train_signature
    from lorarl.study import StudyError, parse_study, study_cells

    assert train_signature(CellConfig()) == train_signature(CellConfig(runtime={"generation": {"cache": "static",
                                                                                               "compile": "on"}}))
    with pytest.raises(StudyError) as err:
        study_cells(parse_study({"name": "s", "defaults": {"runtime": {"generation": {"cache": "paged"}}}}))
    msg = str(err.value)
    assert "runtime.generation.cache" in msg and all(v in msg for v in ("'auto'", "'static'", "'dynamic'"))


def used_static(model) -> bool:
    """transformers' generate built a StaticCache on ``model`` (it records the cache length there)."""
    from lorarl.decoding import base_model

    return getattr(base_model(model), "_previous_max_cache_length", None) is not None


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


@pytest.fixture(scope="module")
def solo_trainer(tiny_dir, tmp_path_factory):
    from lorarl.config import CellConfig
    from lorarl.memory.measure import tiny_trainer

    cfg = CellConfig.model_validate({"model": str(tiny_dir), "adapter": {"method": "lora", "rank": 2},
                                     "train": {"prompts_per_step": 4, "generations": 2, "max_completion_length": 10,
                                               "temperature": 0.9, "top_p": 0.95},
                                     "runtime": {"generation": {"cache": "static"}}})
    trainer, _ = tiny_trainer(str(tiny_dir), cfg, str(tmp_path_factory.mktemp("solo")))
    eos = trainer.processing_class.eos_token_id

    def bias(_m, _i, out):  # EOS made likely: rows end at different steps inside a chunk
        out = out.clone()
        out[..., eos] += 3.0
        return out

    trainer.model.get_base_model().lm_head.register_forward_hook(bias)
    return trainer


def test_training_rollouts_static_cache_gives_the_same_tokens(solo_trainer):
    trainer = solo_trainer
    assert trainer.generation_engine == STATIC  # the cell's runtime.generation reaches the trainer
    tok = trainer.processing_class
    prompts = [tok(f"Q: {i}+{3 * i}=?" + " x" * (i % 3))["input_ids"] for i in range(8)]

    def rollouts(engine, chunk):
        trainer.generation_engine, trainer.generation_batch_size = engine, chunk
        torch.manual_seed(5)
        ids, _ = trainer._generate_single_turn(prompts, None, {}, 2)
        return ids, torch.rand(3)  # the global stream after the rollouts: consumed alike

    ref = rollouts(DYNAMIC, None)
    assert not used_static(trainer.model)
    assert len({len(c) for c in ref[0]}) > 1 and len({tuple(c) for c in ref[0]}) == 8  # the test can fail
    got = rollouts(STATIC, 3)  # in chunks too (each chunk its own static cache)
    assert got[0] == ref[0] and torch.equal(got[1], ref[1])
    assert used_static(trainer.model)
    top_k = trainer.generation_config.top_k
    try:
        trainer.generation_config.top_k = 1  # one token left: greedy decoding
        assert rollouts(STATIC, 3)[0] == rollouts(DYNAMIC, None)[0]
    finally:
        trainer.generation_config.top_k = top_k


def cell(tiny_dir, cid, seed, **train):
    from lorarl.config import CellConfig

    cfg = CellConfig(model=str(tiny_dir), seed=seed,
                     task={"name": "synthetic", "seed": 7, "n_train": 12, "n_eval": 4, "max_value": 9},
                     adapter={"method": "lora", "rank": 4, "alpha": 8, "dropout": 0.0},
                     train={"lr": 1e-2, "steps": 2, "prompts_per_step": 2, "generations": 2,
                            "max_completion_length": 8, **train},
                     runtime={"generation": {"cache": "static"}})
    return SimpleNamespace(id=cid, config=cfg)


def test_packed_rollouts_static_cache_gives_the_same_tokens(tiny_dir, tmp_path):
    from lorarl.pack.build import build_pack
    from lorarl.pack.generate import generate

    pack = build_pack([cell(tiny_dir, "a", 1, temperature=0.9), cell(tiny_dir, "b", 2, top_p=0.9)],
                      results_dir=tmp_path)
    lp = pack.loop
    assert lp.sample.engine == STATIC  # the cells' runtime.generation reaches the sampler
    prompts = [lp.members[0].prompt_ids[:5], lp.members[1].prompt_ids[2:5]]

    def samples(engine, chunk, temperature=None):
        s = dataclasses.replace(lp.sample, engine=engine, generation_batch_size=chunk)
        if temperature is not None:
            s = dataclasses.replace(s, temperature=temperature)
        gens = [torch.Generator().manual_seed(x) for x in (11, 12)]
        return [r.completion_ids for r in generate(lp.trainer.router, prompts, gens, s)], [g.get_state() for g in gens]

    ref, states = samples(DYNAMIC, None)
    assert len({tuple(c) for r in ref for c in r}) == 8  # distinct samples: the comparison can fail
    got, st = samples(STATIC, 3)  # in chunks too (each chunk its own static cache)
    assert got == ref and all(torch.equal(a, b) for a, b in zip(st, states))
    cold = 1e-4  # near-greedy: the top token takes the whole mass
    assert samples(STATIC, 3, cold)[0] == samples(DYNAMIC, None, cold)[0]
