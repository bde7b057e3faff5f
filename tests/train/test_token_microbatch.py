"""Token-budget micro-batches (``train.micro_batch_tokens``, lorarl.train.tokenbudget): a length-skewed update
cut into chunks of at most N token positions (rows sorted by length, each chunk trimmed to its longest row)
gives the loss and the parameter gradients of the unchunked update within 1e-6 in float32, for every loss type x
KL setting (aggregated per loss type) x ratio level, at the smallest budget (every row alone), a medium one and
the whole batch; the plan keeps every chunk within its budget; the config knob is runtime and exclusive."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from lorarl.language.config import CellConfig
from lorarl.language.signature import signature_dump
from lorarl.train.tokenbudget import forward_rows, padded_tokens, plan_chunks, put_back, row_lengths, split_tokens

LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
# the KL term off, and on (aggregated per loss type) with corrected k3 per sequence and uncorrected k1 per token
# (every estimator x level with row chunks: tests/train/test_microbatch.py; a chunk's per-row terms are the same here)
KL = [(0.0, "k3", True, "token"), (0.1, "k3", True, "sequence"), (0.1, "k1", False, "token")]
TC = 18  # completion columns: the longest completion (16) leaves 2 padding columns even in the whole batch
COMPLETIONS = [16, 2, 3, 1, 12, 2, 4, 1]  # length-skewed: two long completions among short ones
PROMPTS = [5, 3, 5, 4, 2, 5, 3, 5]  # left-padded to 5


def _cfg(**train) -> CellConfig:
    base = {"steps": 2, "prompts_per_step": 4, "generations": 2, "max_completion_length": TC, "kl_monitor_every": 0,
            "beta": 0.1, "dual_clip": 3.0, "epsilon_high": 0.28}
    return CellConfig.model_validate({"train": {**base, **train}})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A trainer on the tiny Qwen2 (full fine-tuning, float32, a frozen reference) and a length-skewed batch."""
    import datasets

    from lorarl.models import load_model_and_tokenizer
    from lorarl.train.prepare import reward_of
    from lorarl.train.trl_args import build_trainer, grpo_args
    from tests.support.tiny_model import save_tiny

    tmp = tmp_path_factory.mktemp("tok")
    base, tok = load_model_and_tokenizer(save_tiny(tmp / "tiny"))
    cfg = _cfg()
    ds = datasets.Dataset.from_list([{"prompt": f"Q: {i}+{i}=?\nA: ", "answer": str(2 * i)} for i in range(8)])
    regime, grading = reward_of(cfg, tok, tmp, "cpu")
    trainer = build_trainer(cfg, model=base, tokenizer=tok, args=grpo_args(cfg, tmp / "o", use_cpu=True),
                            train_dataset=ds, ref_model=copy.deepcopy(base).eval(), regime=regime, grading=grading)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    assert next(trainer.model.parameters()).dtype == torch.float32
    g = torch.Generator().manual_seed(0)
    B, Tp = len(COMPLETIONS), max(PROMPTS)
    pid = tok.pad_token_id
    prompt_mask = (torch.arange(Tp)[None, :] >= Tp - torch.tensor(PROMPTS)[:, None]).long()
    comp_mask = (torch.arange(TC)[None, :] < torch.tensor(COMPLETIONS)[:, None]).long()
    ids = lambda shape: torch.randint(3, len(tok), shape, generator=g)  # noqa: E731
    batch = {"prompt_ids": torch.where(prompt_mask.bool(), ids((B, Tp)), pid), "prompt_mask": prompt_mask,
             "completion_ids": torch.where(comp_mask.bool(), ids((B, TC)), pid), "completion_mask": comp_mask,
             "num_items_in_batch": comp_mask.sum().float()}
    with torch.no_grad():
        logp_BT = trainer._forward_logps(trainer.model, batch)
        batch["lorarl_ref_logps"] = trainer._forward_logps(trainer.reference_model, batch) - 0.05
    wiggle_BT = 0.3 * torch.sin(torch.arange(B * TC, dtype=torch.float32)).view(B, TC)
    batch["old_per_token_logps"] = (logp_BT - wiggle_BT).detach()  # ratios on both sides of the clip range
    batch["advantages"] = torch.randn(B, TC, generator=g) * comp_mask  # a value per token
    return trainer, batch


def _grads(trainer, batch, budget):
    trainer.micro_batch_tokens = budget
    trainer.model.zero_grad(set_to_none=True)
    try:
        loss = trainer.compute_loss(trainer.model, batch)
        trainer.accelerator.backward(loss)
    finally:
        trainer.micro_batch_tokens = None
    return loss.item(), {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def _budgets(batch) -> dict[str, int]:
    lengths = row_lengths(batch)
    return {"smallest": 1, "medium": 2 * max(lengths), "whole": len(lengths) * max(lengths)}


@pytest.mark.parametrize("beta,estimator,corrected,level", KL)
@pytest.mark.parametrize("loss_type", LOSSES)
def test_token_chunks_give_the_unchunked_loss_and_gradients(setup, loss_type, beta, estimator, corrected, level):
    trainer, batch = setup
    trainer.loss_type, trainer.kl_beta, trainer.kl_estimator = loss_type, beta, estimator
    trainer.kl_importance_correction, trainer.importance_sampling_level = corrected, level
    whole, g_whole = _grads(trainer, batch, None)
    assert math.isfinite(whole) and g_whole
    for name, budget in _budgets(batch).items():
        n_chunks = len(split_tokens(batch, budget))
        assert n_chunks == {"smallest": 8, "whole": 1}.get(name, n_chunks) and (name != "medium" or 2 < n_chunks < 8)
        loss, g = _grads(trainer, batch, budget)
        assert loss == pytest.approx(whole, abs=1e-6, rel=1e-6), (name, loss, whole)
        assert g.keys() == g_whole.keys()
        for p in g:
            torch.testing.assert_close(g[p], g_whole[p], atol=1e-6, rtol=1e-6, msg=f"{name} {p}")


def test_the_kl_monitors_see_the_whole_batch_in_its_order(setup):
    trainer, batch = setup
    trainer.loss_type, trainer.kl_beta = "grpo", 0.0
    trainer._last_batch = None
    _grads(trainer, batch, None)
    whole = trainer._last_batch[1]
    _grads(trainer, batch, 2 * max(row_lengths(batch)))
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(trainer._last_batch[1][mask], whole[mask], atol=1e-6, rtol=1e-6)


def test_the_plan_sorts_groups_and_keeps_each_chunk_within_its_budget():
    lengths = [30, 5, 6, 4, 20, 5, 7, 4]
    assert plan_chunks(lengths, 1) == [[0], [4], [6], [2], [1], [5], [3], [7]]  # every row over budget: alone
    assert plan_chunks(lengths, 40) == [[0], [4, 6], [2, 1, 5, 3, 7]]  # ties in index order
    for budget in (1, 7, 12, 25, 40, 61, 240):
        chunks = plan_chunks(lengths, budget)
        assert sorted(i for c in chunks for i in c) == list(range(8))
        for c in chunks:
            assert len(c) == 1 or len(c) * max(lengths[i] for i in c) <= budget, (budget, c)
    assert plan_chunks(lengths, 240) == [[0, 4, 6, 2, 1, 5, 3, 7]]
    assert padded_tokens([[0], [4, 6], [2, 1, 5, 3, 7]], [30, 20, 6], sum(lengths)) == 30 + 40 + 30 - 81
    with pytest.raises(ValueError, match="micro_batch_tokens must be at least 1"):
        plan_chunks(lengths, 0)
    assert (forward_rows(100, 30), forward_rows(10, 30)) == (3, 1)


def test_chunks_are_trimmed_to_their_longest_row_and_put_back():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    batch = {"prompt_ids": torch.arange(6).view(3, 2), "prompt_mask": torch.ones(3, 2, dtype=torch.long),
             "completion_ids": torch.arange(15).view(3, 5), "completion_mask": mask, "tool_mask": mask.clone(),
             "advantages": torch.ones(3, 5), "importance_sampling_ratio": torch.ones(3, 1),
             "num_items_in_batch": torch.tensor(6.0)}
    assert row_lengths(batch) == [5, 3, 4]
    chunks = split_tokens(batch, 8)  # [0] (5 x 1), then [2, 1] (2 x 4)
    assert [rows for rows, _ in chunks] == [[0], [2, 1]]
    c = chunks[1][1]
    assert c["completion_ids"].tolist() == [[10, 11], [5, 6]] and c["advantages"].shape == (2, 2)
    assert c["prompt_ids"].tolist() == [[4, 5], [2, 3]] and c["tool_mask"].shape == (2, 2)  # prompts kept whole
    assert c["importance_sampling_ratio"].shape == (2, 1) and c["num_items_in_batch"] is batch["num_items_in_batch"]
    back = put_back([(rows, cb["completion_ids"].float()) for rows, cb in chunks], 3, 5)
    assert back.tolist() == [[0, 1, 2, 0, 0], [5, 6, 0, 0, 0], [10, 11, 0, 0, 0]]


def test_the_knob_is_runtime_and_exclusive_with_rows():
    cfg = _cfg(micro_batch_tokens=512)
    assert cfg.train.micro_batch_tokens == 512
    assert signature_dump(cfg) == signature_dump(_cfg())  # runtime: out of the training signature
    with pytest.raises(ValueError, match=r"micro_batch_tokens \(512\) and train.micro_batch_size \(2\) both set"):
        _cfg(micro_batch_tokens=512, micro_batch_size=2)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        _cfg(micro_batch_tokens=0)
    from lorarl.train.tokenbudget import check_world

    check_world(512, 1), check_world(None, 4)  # one process, or no budget: fine
    with pytest.raises(ValueError, match=r"micro_batch_tokens \(512\) on 2 ranks.*allowed on several ranks"):
        check_world(512, 2)


def test_the_memory_plan_charges_a_budget_as_its_rows_and_learns_the_largest():
    from lorarl.memory import plan_cell
    from lorarl.language.study import load_study, study_cells

    cfg = next(c.config for c in study_cells(load_study(Path(__file__).resolve().parents[2] / "experiments" / "peft_zoo.yaml")) if c.config.adapter.method == "lora")
    t = cfg.train.model_copy(update={"micro_batch_size": None})
    free = plan_cell(cfg.model_copy(update={"train": t}), 80)
    assert free.max_micro_tokens == free.max_micro_batch * free.seq > 0  # the largest budget that fits
    for rows in (1, 3, free.max_micro_batch):
        budget = rows * free.seq + free.seq - 1  # a forward holds at most `rows` whole-width rows
        tok = plan_cell(cfg.model_copy(update={"train": t.model_copy(update={"micro_batch_tokens": budget})}), 80)
        assert tok.micro_batch == min(rows, tok.rows) and tok.fits == (rows <= free.max_micro_batch)
    over = plan_cell(cfg.model_copy(update={"train": t.model_copy(update={"micro_batch_tokens": 1})}), 80)
    assert over.micro_batch == 1  # a row longer than the budget goes alone


def test_an_oom_retry_shrinks_a_token_budget_with_its_rung():
    from lorarl.memory.ladder import TrainRung, planned_train, train_config

    cfg = _cfg(micro_batch_tokens=512)  # 4 prompts x 2 generations = 8 rows per update
    assert planned_train(cfg, "cpu") == TrainRung(8, 8, False)
    half = train_config(cfg, TrainRung(4, 4, True))
    assert (half.train.micro_batch_tokens, half.train.micro_batch_size) == (256, None)
    assert train_config(cfg, TrainRung(8, 8, False)).train.micro_batch_tokens == 512
    assert signature_dump(half) == signature_dump(cfg)
