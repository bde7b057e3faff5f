"""LorarlGRPOTrainer against stock TRL 1.16 GRPOTrainer, reference-forward counting, monitors, DAPO options.

Correctness gate: for the outcome regime, the loss and the gradients of lorarl's training step equal
stock TRL's GRPO loss/gradients on the same batch to <= 1e-6, for beta = 0 and beta > 0.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lorarl.numerics.kl import frozen_reference
from lorarl.train.trainer import LorarlGRPOTrainer
from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.rewards.process import ProcessDeposits, RuleStepChecker
from tests.support.grpo import G, MAXLEN, P, args, dataset, fake_score, load, metric_steps, raw_batch


def stock_reward(prompts, completions, **kw):
    return fake_score(completions)


stock_reward.__name__ = "outcome"


def lora(dropout=0.0):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM")


def perturb_adapters(model, seed=1):
    """Non-zero LoRA B so the policy differs from the base (else every KL and its gradient is 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def trainable_grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def one_step(trainer, inputs):
    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), trainable_grads(trainer.model)


def make_pair(tiny_dir, tmp_path, beta, loss_type, **kw):
    from trl import GRPOTrainer
    from lorarl.train.rowsample import ChunkedRollouts
    from lorarl.train.streams import CellStreams, sampling_generator

    class Stock(CellStreams, ChunkedRollouts, GRPOTrainer):
        """Stock TRL with lorarl's HF sampler (lorarl.train.rowsample) and the cell's data order and sampling stream
        (lorarl.train.streams), so both draw the same prompts and generations."""

    m1, tok = load(tiny_dir)
    m2, _ = load(tiny_dir)
    a = args(tmp_path, beta=beta, loss_type=loss_type, **kw)
    torch.manual_seed(0)
    stock = Stock(model=m1, reward_funcs=[stock_reward], args=a, train_dataset=dataset(),
                        processing_class=tok, peft_config=lora())
    stock.sample_generator = sampling_generator(a.seed)
    torch.manual_seed(0)
    ours_args = args(tmp_path, loss_type=loss_type, **kw)  # TRL's beta 0: the coefficient is kl_beta
    ours = LorarlGRPOTrainer(model=m2, regime=OutcomeDeposits(score_fn=fake_score), args=ours_args, kl_beta=beta,
                             train_dataset=dataset(), processing_class=tok, peft_config=lora(), ref_model="auto")
    for t in (stock, ours):
        perturb_adapters(t.model)
        t.current_gradient_accumulation_steps = 1
    return stock, ours


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_outcome_loss_and_grads_equal_stock_trl(tiny_dir, tmp_path, beta, loss_type):
    stock, ours = make_pair(tiny_dir, tmp_path, beta, loss_type, epsilon_high=0.28)
    batch = raw_batch(dataset())
    gen = {}
    real = stock._generate

    def capture(prompts):
        gen["out"] = real(prompts)
        return gen["out"]

    stock._generate = capture

    def replay(prompts):  # the same completions for both trainers (what our _generate override records)
        ours._prompt_ids_list = gen["out"][0]
        return gen["out"]

    ours._generate = replay
    torch.manual_seed(0)
    in_s = stock._generate_and_score_completions(batch)
    in_o = LorarlGRPOTrainer._generate_and_score_completions(ours, batch)
    assert in_o["advantages"].shape == in_o["completion_ids"].shape  # [B, T]
    assert in_s["advantages"].abs().sum() > 0  # a real signal
    # stock's [B] advantage is ours on every token
    mask = in_o["completion_mask"].bool()
    assert torch.allclose(in_o["advantages"], in_s["advantages"].unsqueeze(1) * mask, atol=0, rtol=0)
    loss_s, grads_s = one_step(stock, in_s)
    loss_o, grads_o = one_step(ours, in_o)
    assert abs(loss_s.item() - loss_o.item()) <= 1e-6
    assert grads_s.keys() == grads_o.keys() and len(grads_s) > 0
    worst = max((grads_s[k] - grads_o[k]).abs().max().item() for k in grads_s)
    assert worst <= 1e-6
    if beta > 0:  # TRL's reference (adapters disabled) and ours (frozen copy) are the same base here
        assert torch.allclose(in_s["ref_per_token_logps"], in_o["lorarl_ref_logps"], atol=1e-6)
        assert any(abs(g).max() > 0 for g in grads_o.values())


def test_two_training_steps_match_stock(tiny_dir, tmp_path):
    """End to end through Trainer.train(): same generations, same updates, same parameters."""
    stock, ours = make_pair(tiny_dir, tmp_path, 0.05, "grpo")
    for t in (stock, ours):
        torch.manual_seed(0)
        t.train()
    ps = dict(stock.model.named_parameters())
    worst = max((p - ps[n]).abs().max().item() for n, p in ours.model.named_parameters() if p.requires_grad)
    assert worst <= 1e-5
    ls = [h["loss"] for h in stock.state.log_history if "loss" in h]
    lo = [h["loss"] for h in ours.state.log_history if "loss" in h]
    assert ls == pytest.approx(lo, abs=1e-6)


class Counter:
    """Counts reference forwards and where they happen."""

    def __init__(self, trainer):
        self.calls, self.with_grad, self.in_loss = 0, 0, 0
        self._loss = False
        trainer.reference_model.register_forward_pre_hook(self.hook)
        real = trainer.compute_loss

        def compute_loss(*a, **k):
            self._loss = True
            try:
                return real(*a, **k)
            finally:
                self._loss = False

        trainer.compute_loss = compute_loss

    def hook(self, module, args):
        self.calls += 1
        self.with_grad += torch.is_grad_enabled()
        self.in_loss += self._loss


@pytest.mark.parametrize("beta,every,expected", [(0.0, 2, 2), (0.0, 0, 0), (0.05, 0, 4), (0.05, 2, 4)])
def test_reference_forward_count(tiny_dir, tmp_path, beta, every, expected):
    model, tok = load(tiny_dir)
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score),
                                args=args(tmp_path, max_steps=4), kl_beta=beta, train_dataset=dataset(),
                                processing_class=tok, peft_config=lora(), kl_monitor_every=every)
    if trainer.reference_model is None:
        assert expected == 0 and every == 0 and beta == 0
        trainer.train()
        assert metric_steps(trainer, "kl_ref/k3") == []
        return
    c = Counter(trainer)
    trainer.train()
    assert c.calls == expected
    assert c.with_grad == 0 and c.in_loss == 0  # never during the loss, never with grad
    if beta == 0 and every:
        assert metric_steps(trainer, "kl_ref/k3") == [2, 4]
        assert metric_steps(trainer, "time/kl_monitor_s") == [2, 4]
        assert metric_steps(trainer, "kl_new_old") == [2, 4]
    if beta > 0:
        assert metric_steps(trainer, "kl_ref/k3") == [1, 2, 3, 4]
        assert metric_steps(trainer, "time/ref_forward_s") == [1, 2, 3, 4]
    steps = metric_steps(trainer, "adv/std")
    assert steps == [1, 2, 3, 4]
    for name in ("adv/std_peak", "frac_truncated", "frac_boxed", "frac_answered", "deposits/per_completion", "entropy",
                 "clip_ratio/region_mean", "grad_norm", "time/step_s", "tokens_per_s", "completions/mean_length",
                 "reward", "reward_std"):
        assert metric_steps(trainer, name) == [1, 2, 3, 4], name


def test_kl_new_old_free_with_several_iterations(tiny_dir, tmp_path):
    model, tok = load(tiny_dir)
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score),
                                args=args(tmp_path, max_steps=4, num_iterations=2), train_dataset=dataset(),
                                processing_class=tok, peft_config=lora(), kl_monitor_every=1)
    calls, logged = [], []
    real, real_log = trainer._forward_logps, trainer._log_kl_new_old
    trainer._forward_logps = lambda m, b: calls.append(m is trainer.model) or real(m, b)
    trainer._log_kl_new_old = lambda *a: logged.append(trainer.state.global_step) or real_log(*a)
    trainer.train()
    # Pass 2 over a batch gets update 1's KL for free from its loss forward (logged during update 2 / 4);
    # after the last pass (updates 2 and 4) one extra policy forward gives update 2's and the rollout's.
    assert logged == [1, 2, 2, 3, 4, 4]  # global_step at logging
    assert calls.count(True) == 2
    assert metric_steps(trainer, "kl_new_old") == [2, 4] == metric_steps(trainer, "kl_new_old/update")
    vals = [h["kl_new_old"] for h in trainer.state.log_history if "kl_new_old" in h]
    assert all(v >= 0 for v in vals) and any(v > 0 for v in vals)


def test_reference_is_the_original_base(tiny_dir):
    model, _ = load(tiny_dir)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ref = frozen_reference(model)
    with torch.no_grad():  # what a residual init (PiSSA, OLoRA) does to the base weights
        for p in model.parameters():
            p.mul_(0.5)
    assert all(torch.equal(ref.state_dict()[k], v) for k, v in original.items())
    assert not any(p.requires_grad for p in ref.parameters())
    from peft import get_peft_model

    with pytest.raises(ValueError, match="before an adapter"):
        frozen_reference(get_peft_model(copy.deepcopy(model), lora()))


def test_beta_needs_a_reference_for_prewrapped_models(tiny_dir, tmp_path):
    from peft import get_peft_model

    model, tok = load(tiny_dir)
    with pytest.raises(ValueError, match="before an adapter"):
        LorarlGRPOTrainer(model=get_peft_model(model, lora()), regime=OutcomeDeposits(score_fn=fake_score),
                          args=args(tmp_path), kl_beta=0.05, train_dataset=dataset(), processing_class=tok)


def test_dynamic_sampling_refills_degenerate_groups_with_new_ones(tiny_dir, tmp_path):
    """DAPO: a degenerate group is replaced by a freshly sampled group with signal; the batch keeps
    its P groups (it never shrinks), and after max rounds degenerate groups fill the rest."""
    model, tok = load(tiny_dir)
    rounds = iter([[1.0, 1.0, 0.0, 1.0],  # round 1: group 0 all equal, group 1 not
                   [0.0, 0.0, 1.0, 0.0]])  # round 2 (P new prompts): group 1 has signal

    def scores(completions, answers):
        return next(rounds)

    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=scores),
                                args=args(tmp_path, loss_type="dapo"), train_dataset=dataset(),
                                processing_class=tok, peft_config=lora(), dynamic_sampling=True)
    trainer.model.train()
    out = trainer._generate_and_score_completions(raw_batch(dataset()))
    assert out["completion_ids"].size(0) == P * G and out["advantages"].size(0) == P * G
    adv = out["advantages"].sum(-1)  # per completion: +-1 normalised in both kept groups, never 0
    assert (adv.abs() > 0).all() and adv.view(P, G).sum(-1).abs().max() < 1e-4
    assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
    m = trainer._metrics["train"]
    assert m["dynamic_sampling/frac_groups_dropped"] == [0.5] and m["dynamic_sampling/rounds"] == [2]
    assert m["dynamic_sampling/frac_groups_degenerate"] == [0.0]
    assert m["rollout/degenerate_rate"] == [0.5, 0.5]  # every round's share of all-equal groups (lorarl doctor)
    trainer.current_gradient_accumulation_steps = 1
    assert torch.isfinite(trainer.compute_loss(trainer.model, out))

    trainer.regime = OutcomeDeposits(score_fn=lambda c, a: [1.0] * len(c))  # nothing ever has signal
    out = trainer._generate_and_score_completions(raw_batch(dataset()))
    assert out["completion_ids"].size(0) == P * G and (out["advantages"] == 0).all()
    assert m["dynamic_sampling/rounds"][-1] == 3 and m["dynamic_sampling/frac_groups_degenerate"][-1] == 1.0
    assert m["rollout/degenerate_rate"][-3:] == [1.0, 1.0, 1.0]
    from lorarl.train.dynamic_sampling import PromptSampler  # draws depend on (seed, step, round) only: resumable

    s1, s2 = PromptSampler(dataset(), 0), PromptSampler(dataset(), 0)
    assert s1.draw(2, G, step=5, round_=1) == s2.draw(2, G, step=5, round_=1) != s1.draw(2, G, step=6, round_=1)


def test_concat_batches_pads_prompts_left_and_completions_right():
    from lorarl.train.dynamic_sampling import concat_batches, take_groups

    a = {"prompt_ids": torch.tensor([[5, 6], [7, 8]]), "prompt_mask": torch.ones(2, 2, dtype=torch.long),
         "completion_ids": torch.tensor([[1, 2, 3], [4, 0, 0]]),
         "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]), "num_items_in_batch": torch.tensor(4)}
    b = {"prompt_ids": torch.tensor([[9, 9, 9], [3, 3, 3]]), "prompt_mask": torch.ones(2, 3, dtype=torch.long),
         "completion_ids": torch.tensor([[2], [2]]), "completion_mask": torch.tensor([[1], [1]]),
         "num_items_in_batch": torch.tensor(2)}
    out = concat_batches([take_groups(a, [0], 2), b], pad_token_id=0)
    assert out["prompt_ids"].tolist() == [[0, 5, 6], [0, 7, 8], [9, 9, 9], [3, 3, 3]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[1, 2, 3], [4, 0, 0], [2, 0, 0], [2, 0, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]]
    assert int(out["num_items_in_batch"]) == 6
    assert take_groups(a, [0], 1)["completion_ids"].tolist() == [[1, 2, 3]]


def test_overlong_penalty_lands_on_the_last_token(tiny_dir, tmp_path):
    model, tok = load(tiny_dir)
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=lambda c, a: [0.0] * len(c)),
                                args=args(tmp_path), train_dataset=dataset(), processing_class=tok,
                                peft_config=lora(), overlong_buffer=4, overlong_factor=1.0)
    trainer.model.train()
    trainer._generate_and_score_completions(raw_batch(dataset()))
    dep = trainer._deposits
    for n, pos, vals in zip(trainer._lengths, dep.positions, dep.values):
        assert pos == [n - 1]
        assert vals[0] == pytest.approx(min(0.0, (MAXLEN - 4 - n) / 4))


def test_process_and_distillation_regimes_train(tiny_dir, tmp_path):
    from lorarl.rewards.distillation import DistillationDeposits, TeacherScorer

    model, tok = load(tiny_dir)
    seen = []

    class SpyProcess(ProcessDeposits):
        def deposits(self, rollouts):
            seen.append(rollouts.answers)
            return super().deposits(rollouts)

    regime = SpyProcess(RuleStepChecker(), tokenizer=tok)
    t = LorarlGRPOTrainer(model=model, regime=regime, args=args(tmp_path, max_steps=1), kl_beta=0.05,
                          train_dataset=dataset(), processing_class=tok, peft_config=lora(),
                          kl_estimator="one_sided")
    t.train()
    assert metric_steps(t, "kl_ref/one_sided") == [1] and metric_steps(t, "kl_ref/penalty") == [1]
    assert metric_steps(t, "accuracy") == [1]  # graded for monitoring only
    assert seen == [None]  # the process regime never receives the gold answers

    model, tok = load(tiny_dir)
    teacher_model, _ = load(tiny_dir)
    with torch.no_grad():
        for p in teacher_model.parameters():
            p.add_(0.01)
    regime = DistillationDeposits(TeacherScorer(teacher_model, pad_token_id=tok.pad_token_id))
    t = LorarlGRPOTrainer(model=model, regime=regime, args=args(tmp_path, max_steps=1), train_dataset=dataset(),
                          processing_class=tok, peft_config=lora())
    t.train()
    h = t.state.log_history[0]
    assert h["deposits/per_completion"] == pytest.approx(h["completions/mean_length"])
    assert h["adv/std"] > 0


def test_monitor_does_not_change_training(tiny_dir, tmp_path):
    """The KL monitors run under no_grad on a forked RNG: training is bit-identical with and without
    (LoRA dropout on, so the monitor's policy forward would otherwise consume random numbers)."""
    params = []
    for every in (0, 1):
        model, tok = load(tiny_dir)
        torch.manual_seed(0)
        t = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score),
                              args=args(tmp_path, max_steps=3), train_dataset=dataset(), processing_class=tok,
                              peft_config=lora(dropout=0.1), kl_monitor_every=every)
        t.train()
        params.append({n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad})
        if every:
            assert metric_steps(t, "kl_ref/k3") == [1, 2, 3]
    assert all(torch.equal(params[0][n], params[1][n]) for n in params[0])
