"""Micro-batched updates (``train.micro_batch_size``, lorarl.train.microbatch): an update cut into chunks of
1, 2 or 3 sequences (uneven last chunk) gives the loss and the gradients of the unbatched update, for every
loss type x advantage shape (outcome, process, distillation) x KL setting x ratio level; activation
checkpointing gives the gradients of no checkpointing; the in-loss metrics (entropy, kl, clip ratios) are logged once,
the unbatched update's; chunked log-probs equal unchunked; a 20-step cell
trained with micro-batches of 2 and checkpointing ends with the adapter of the plain run."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lorarl.language.config import CellConfig
from lorarl.train.microbatch import chunk_share, micro_size, split_rows

G = 2
LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
REGIMES = ("outcome", "process", "distillation")
KL = [(0.0, "k3", True), (0.1, "k1", True), (0.1, "k3", True), (0.1, "k3", False), (0.1, "one_sided", True)]
LEVELS = ("token", "sequence")


def _cfg(**train) -> CellConfig:
    base = {"steps": 2, "prompts_per_step": 2, "generations": G, "max_completion_length": 6, "kl_monitor_every": 0,
            "beta": 0.1, "dual_clip": 3.0, "epsilon_high": 0.28}
    return CellConfig.model_validate({"train": {**base, **train}})


def _trainer(tiny_dir, tmp_path, cfg, model=None):
    import datasets

    from lorarl.models import load_model_and_tokenizer
    from lorarl.train.prepare import reward_of
    from lorarl.train.trl_args import build_trainer, grpo_args

    base, tok = load_model_and_tokenizer(tiny_dir)
    ds = datasets.Dataset.from_list([{"prompt": f"Q: {i}+{i}=?\nA: ", "answer": str(2 * i)} for i in range(8)])
    ref = copy.deepcopy(base).eval() if cfg.train.beta > 0 else None
    regime, grading = reward_of(cfg, tok, tmp_path, "cpu")
    trainer = build_trainer(cfg, model=model or base, tokenizer=tok, args=grpo_args(cfg, tmp_path / "o", use_cpu=True),
                            train_dataset=ds, ref_model=ref, regime=regime, grading=grading)
    from lorarl.rewards.outcome import OutcomeDeposits

    trainer.regime = OutcomeDeposits(score_fn=lambda c, a: [1.0, 0.0, 0.0, 1.0][: len(c)])
    trainer.current_gradient_accumulation_steps = 1
    return trainer, ds


@pytest.fixture(scope="module")
def setup(tiny_dir, tmp_path_factory):
    """One trainer (full fine-tuning of the tiny model, a frozen reference) and one generated batch of 4."""
    trainer, ds = _trainer(tiny_dir, tmp_path_factory.mktemp("mb"), _cfg())
    torch.manual_seed(0)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in range(2) for _ in range(G)])
    return trainer, batch


def _advantages(regime: str, mask_BT: torch.Tensor) -> torch.Tensor:
    B, T = mask_BT.shape
    g = torch.Generator().manual_seed(1)
    if regime == "outcome":  # one value per sequence
        return torch.randn(B, 1, generator=g).expand(B, T) * mask_BT
    if regime == "process":  # a value per step: constant between step boundaries
        steps_BT = torch.cumsum((torch.rand(B, T, generator=g) < 0.3).float(), dim=1)
        return torch.sin(steps_BT + torch.arange(B)[:, None]) * mask_BT
    return torch.randn(B, T, generator=g) * mask_BT  # distillation: a value per token


def _grads(trainer, batch, m):
    """The update's loss, gradients and the in-loss metrics it logged (name -> its entries)."""
    trainer.micro_batch_size = m
    trainer.model.zero_grad(set_to_none=True)
    before = {k: len(v) for k, v in trainer._metrics["train"].items()}
    loss = trainer.compute_loss(trainer.model, batch)
    trainer.accelerator.backward(loss)
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.micro_batch_size = None
    logged = {k: v[before.get(k, 0):] for k, v in trainer._metrics["train"].items()
              if len(v) > before.get(k, 0) and not k.startswith("kl_new_old")}  # (the monitor's, of a repeated batch)
    return loss.item(), grads, logged


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("beta,estimator,corrected", KL)
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("loss_type", LOSSES)
def test_micro_batches_give_the_unbatched_loss_and_gradients(setup, loss_type, regime, beta, estimator, corrected,
                                                             level):
    trainer, generated = setup
    batch = dict(generated)
    T = batch["completion_mask"].size(1)
    lengths = torch.tensor([T, 2, T - 1, 1])  # unequal tokens per chunk (bnpo's normaliser differs from rows)
    batch["completion_mask"] = (torch.arange(T)[None, :] < lengths[:, None]).to(batch["completion_mask"].dtype)
    mask_BT = batch["completion_mask"].float()
    with torch.no_grad():
        logp_BT = trainer._forward_logps(trainer.model, batch)
    wiggle_BT = 0.3 * torch.sin(torch.arange(mask_BT.numel(), dtype=torch.float32)).view_as(mask_BT)
    batch["old_per_token_logps"] = (logp_BT - wiggle_BT).detach()  # ratios on both sides of the clip range
    batch["advantages"] = _advantages(regime, mask_BT)
    trainer.loss_type, trainer.kl_beta, trainer.kl_estimator = loss_type, beta, estimator
    trainer.kl_importance_correction, trainer.importance_sampling_level = corrected, level
    whole, g_whole, logged_whole = _grads(trainer, batch, None)
    assert math.isfinite(whole) and g_whole
    assert {"entropy", "clip_ratio/low_min", "clip_ratio/high_max"} <= logged_whole.keys()
    for m in (1, 2, 3):  # 3: chunks of 3 and 1
        loss, g, logged = _grads(trainer, batch, m)
        assert loss == pytest.approx(whole, abs=1e-6, rel=1e-6), (m, loss, whole)
        assert logged.keys() == logged_whole.keys() and all(len(v) == 1 for v in logged.values()), m
        for name, (value,) in logged.items():  # the in-loss metrics: the whole update's, once (microbatch.merge_chunks)
            assert value == pytest.approx(logged_whole[name][0], abs=1e-6, rel=1e-6, nan_ok=True), (m, name)
        assert g.keys() == g_whole.keys()
        for name in g:
            torch.testing.assert_close(g[name], g_whole[name], atol=1e-6, rtol=1e-5, msg=f"m={m} {name}")


def test_chunk_metrics_merge_into_the_whole_updates():
    """A masked mean weighted by each chunk's tokens (rows for a sequence-level clip ratio), the extremes' min / max."""
    from lorarl.train.microbatch import merge_chunks

    tokens, rows = [6.0, 2.0], [2.0, 2.0]
    assert merge_chunks("entropy", [1.0, 3.0], tokens, rows) == pytest.approx(1.5)  # (6 + 6) / 8, not 2
    assert merge_chunks("clip_ratio/low_mean", [1.0, 3.0], tokens, rows, sequence_level=True) == pytest.approx(2.0)
    assert merge_chunks("clip_ratio/low_mean", [1.0, 3.0], tokens, rows) == pytest.approx(1.5)
    assert merge_chunks("clip_ratio/low_min", [0.5, 0.25], tokens, rows) == 0.25
    assert merge_chunks("clip_ratio/high_max", [float("nan"), 0.25], tokens, rows) == 0.25
    assert merge_chunks("kl", [1.0, 3.0], [0.0, 0.0], rows) == 0.0  # no tokens: TRL's 0 / max(0, 1)


def test_chunks_and_shares():
    mask_BT = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    inputs = {"completion_ids": torch.zeros(5, 3, dtype=torch.long), "completion_mask": mask_BT,
              "num_items_in_batch": torch.tensor(40.0), "advantages": torch.ones(5, 3)}
    chunks = split_rows(inputs, 2)
    assert [c["completion_mask"].size(0) for c in chunks] == [2, 2, 1]
    assert all(c["num_items_in_batch"] is inputs["num_items_in_batch"] for c in chunks)
    for lt in LOSSES:
        assert sum(chunk_share(lt, c["completion_mask"], mask_BT) for c in chunks) == pytest.approx(
            3.0 if lt == "dapo" else 1.0)
    assert [chunk_share("bnpo", c["completion_mask"], mask_BT) for c in chunks] == pytest.approx([3 / 11, 5 / 11, 3 / 11])
    with pytest.raises(ValueError, match="grpo, bnpo, dr_grpo, dapo"):
        chunk_share("cispo", mask_BT, mask_BT)
    assert (micro_size(4), micro_size("auto"), micro_size(None)) == (4, None, None)
    with pytest.raises(ValueError, match=r"train.micro_batch_size \(5\) exceeds the update's 4 sequences; allowed: 1..4"):
        _cfg(micro_batch_size=5)  # 2 prompts x 2 generations
    with pytest.raises(ValueError, match=r"micro_batch_size \(5\) exceeds the update's 4 sequences"):
        _cfg(prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=5)  # a PPO mini-batch is the update
    assert _cfg(micro_batch_size=3).train.micro_batch_size == 3 and _cfg(micro_batch_size="auto")  # uneven: fine


def test_chunked_log_probs_equal_unchunked(setup):
    trainer, batch = setup
    whole = trainer._forward_logps(trainer.model, batch)
    seen = []
    from trl import GRPOTrainer

    real = GRPOTrainer._get_per_token_logps_and_entropies  # below the mixin: what TRL is asked

    def spy(self, model, *a, **kw):
        seen.append(kw.get("batch_size"))
        return real(self, model, *a, **kw)

    for m in (1, 3):
        trainer.micro_batch_size = m
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", spy)
                chunked = trainer._forward_logps(trainer.model, batch)
        finally:
            trainer.micro_batch_size = None
        torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
        assert seen[-1] == m  # at most m rows of logits at once


def _lora(tiny_dir, method="lora"):
    from lorarl.adapters import build_adapter
    from lorarl.models import load_model_and_tokenizer

    base, _ = load_model_and_tokenizer(tiny_dir)
    extra = {"rank": 4, "alpha": 8} if method == "lora" else {}
    cfg = CellConfig.model_validate({"adapter": {"method": method, **extra}, "train": {"steps": 2}})
    return build_adapter(base, cfg).model


@pytest.mark.parametrize("method", ["full", "lora", "ia3"])
def test_checkpointing_gives_the_same_gradients(tiny_dir, tmp_path, method):
    from lorarl.train.trl_args import checkpointing

    assert checkpointing("auto", use_cpu=True) is False and checkpointing("auto", use_cpu=False) is True
    assert checkpointing("on", use_cpu=True) is True and checkpointing("off", use_cpu=False) is False
    grads = {}
    for gc in ("off", "on"):
        model = None if method == "full" else _lora(tiny_dir, method)
        trainer, ds = _trainer(tiny_dir, tmp_path / gc, _cfg(beta=0.0, gradient_checkpointing=gc), model=model)
        assert trainer.args.gradient_checkpointing is (gc == "on")
        if gc == "on":  # what Trainer.train() does before the first step
            trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            assert trainer.model.is_gradient_checkpointing
        torch.manual_seed(0)
        trainer.model.train()
        batch = trainer._generate_and_score_completions([dict(ds[i]) for i in range(2) for _ in range(G)])
        batch["advantages"] = _advantages("distillation", batch["completion_mask"].float())
        grads[gc] = _grads(trainer, batch, 3)[1]
    assert grads["on"].keys() == grads["off"].keys() and grads["on"]
    for name in grads["on"]:
        torch.testing.assert_close(grads["on"][name], grads["off"][name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_a_20_step_cell_with_micro_batches_and_checkpointing_ends_with_the_same_adapter(tiny_dir, tmp_path):
    """In float64: chunked sums differ from the whole batch's by float rounding, and AdamW turns rounding
    noise on a near-zero gradient coordinate into a full step (update ~ lr g / (|g| + eps)); in fp32 that
    noise is ~1e-7 relative and the 20-step adapters differ by ~2e-5 on this model, in float64 by ~1e-14."""
    finals, logs = {}, {}
    for name, knobs in {"plain": {}, "micro": {"micro_batch_size": 2, "gradient_checkpointing": "on"}}.items():
        cfg = _cfg(steps=20, beta=0.0, lr=0.02, kl_monitor_every=5, **knobs)
        torch.manual_seed(0)
        trainer, _ = _trainer(tiny_dir, tmp_path / name, cfg, model=_lora(tiny_dir).double())
        trainer.train()
        assert trainer.state.global_step == 20 and trainer.args.gradient_checkpointing is (name == "micro")
        finals[name] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        rows = [h for h in trainer.state.log_history if "kl_new_old" in h]
        assert len(rows) == 4  # the monitors saw the whole batch at steps 5, 10, 15, 20
        logs[name] = [(h["loss"], h["grad_norm"], h.get("kl_new_old", -1.0), h.get("kl_new_old/update", -1.0))
                      for h in trainer.state.log_history if "loss" in h]
    start = {n: p.double() for n, p in _lora(tiny_dir).named_parameters() if p.requires_grad}
    assert max((finals["plain"][n] - start[n]).abs().max().item() for n in start) > 0.05  # the adapter trained
    for n in finals["plain"]:
        torch.testing.assert_close(finals["micro"][n], finals["plain"][n], atol=1e-5, rtol=0, msg=n)
    assert len(logs["micro"]) == len(logs["plain"]) == 20  # one row per step, the same metrics logged
    for got, want in zip(logs["micro"], logs["plain"]):
        assert got == pytest.approx(want, abs=1e-6, rel=1e-6, nan_ok=True)


def _forward_backward(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).sum().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_checkpointing_works_for_every_registered_method(tiny_dir, monkeypatch):
    """Every adapter method of the registry (and full fine-tuning) under TRL's checkpointing setup (PEFT:
    ``enable_input_require_grads``, non-reentrant checkpoints): the layers are really recomputed and the
    gradients equal those without checkpointing."""
    import transformers.modeling_utils as hf
    from peft import PeftModel

    from lorarl.adapters.registry import METHODS, REGISTRY
    from lorarl.models import load_model_and_tokenizer

    calls = []
    real = hf.checkpoint

    def counting(*a, **kw):
        calls.append(kw.get("use_reentrant"))
        return real(*a, **kw)

    monkeypatch.setattr(hf, "checkpoint", counting)  # transformers binds it at gradient_checkpointing_enable
    ids = torch.tensor([[5, 17, 33, 8, 21, 40], [9, 3, 27, 11, 6, 2]])
    for method in METHODS:
        base, _ = load_model_and_tokenizer(tiny_dir)
        fields = REGISTRY[method].fields  # a rank the 32-wide tiny model takes, where it applies
        spec = {"method": method, **{k: v for k, v in {"rank": 4, "alpha": 8}.items() if k in fields}}
        cfg = CellConfig.model_validate({"adapter": spec, "train": {"steps": 2}})
        model = build_adapter_model(base, cfg)
        model.train()
        torch.manual_seed(0)
        off = _forward_backward(model, ids)
        if isinstance(model, PeftModel):  # what GRPOTrainer.__init__ does for a PEFT model with checkpointing
            model.enable_input_require_grads()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        n0 = len(calls)
        torch.manual_seed(0)
        on = _forward_backward(model, ids)
        assert len(calls) > n0 and set(calls[n0:]) == {False}, method  # non-reentrant recomputation ran
        assert on.keys() == off.keys() and on, method
        for name in on:
            torch.testing.assert_close(on[name], off[name], atol=1e-6, rtol=1e-5, msg=f"{method} {name}")


def build_adapter_model(base, cfg):
    from lorarl.adapters import build_adapter

    return build_adapter(base, cfg).model
