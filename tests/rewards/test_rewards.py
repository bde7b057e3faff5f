"""Reward regimes → deposits: outcome, process (rule checker + Math-Shepherd-style HF PRM), distillation.

Every regime gets a hand-computed 2-prompt x 2-completion example (deposits and advantages).
"""

from __future__ import annotations

import math

import pytest
import torch

from lorarl.train.advantages import ADV_EPS, advantages_from_deposits
from lorarl.rewards import Deposits, Rollouts, decode_tokens, overlong_penalty
from lorarl.rewards.distillation import DistillationDeposits, TeacherScorer, check_shared_tokenizer
from lorarl.rewards.outcome import OutcomeDeposits, gold_answer
from lorarl.rewards.process import (
    ParseError, ProcessDeposits, RuleStepChecker, ShepherdPRM, chain_steps, check_equation, parse_arith,
    split_steps,
)

Q1, Q2 = "Q: 23+45-17=?\nA: ", "Q: 5+5=?\nA: "


def chars(text: str, eos: bool = True) -> list[str]:
    """A character-level 'tokenisation' (+ an EOS token that decodes to '')."""
    return list(text) + ([""] if eos else [])


def rollouts(prompts, completions, answers=None, **kw) -> Rollouts:
    tt = [chars(c) for c in completions]
    return Rollouts(prompts=prompts, completions=completions, prompt_ids=[[1]] * len(prompts),
                    completion_ids=[[7] * len(t) for t in tt], token_texts=tt, answers=answers, **kw)


def advantages(dep: Deposits, lengths: list[int], G: int = 2):
    T = max(lengths)
    mask = torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    row, pos, val = dep.flat()
    return advantages_from_deposits(row, pos, val, mask, G, dense=dep.dense).adv_BT


def z(values, x):
    t = torch.tensor(values, dtype=torch.float32)
    return ((x - t.mean()) / (t.std() + ADV_EPS)).item()


# ----------------------------------------------------------------------------- outcome
def test_outcome_2x2_with_math_verify():
    comps = ["23+45=68\n68-17=51\n\\boxed{51}", "\\boxed{50}", "5+5=10\n\\boxed{10}", "\\boxed{10.0}"]
    r = rollouts([Q1, Q1, Q2, Q2], comps, answers=["51", "51", "10", "10"])
    dep = OutcomeDeposits().deposits(r)
    lengths = [len(c) + 1 for c in comps]
    assert dep.positions == [[n - 1] for n in lengths]  # the last token (EOS)
    assert dep.values == [[1.0], [0.0], [1.0], [1.0]]
    adv = advantages(dep, lengths)
    hi = 0.5 / (1 / math.sqrt(2) + ADV_EPS)
    assert torch.allclose(adv[0, : lengths[0]], torch.full((lengths[0],), hi))
    assert torch.allclose(adv[1, : lengths[1]], torch.full((lengths[1],), -hi))
    assert adv[2:].abs().max() == 0  # both right: no signal


def test_outcome_needs_gold_and_gold_normalisation():
    with pytest.raises(ValueError, match="gold"):
        OutcomeDeposits().deposits(rollouts([Q1], ["x"]))
    assert gold_answer("He has 3+39=<<3+39=42>>42.\n#### 1,042") == "1042"
    assert gold_answer("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert gold_answer(" 51 ") == "51"


def test_overlong_penalty_ramp():
    assert overlong_penalty(10, 20, 0, 1.0) == 0.0
    assert overlong_penalty(12, 20, 8, 1.0) == 0.0
    assert overlong_penalty(16, 20, 8, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(20, 20, 8, 2.0) == pytest.approx(-2.0)
    d = Deposits([[3]], [[1.0]])
    d.add(0, 3, -0.5)
    d.add(0, 1, 0.25)
    assert d.positions == [[3, 1]] and d.values == [[0.5, 0.25]] and d.totals == [0.75]


# ----------------------------------------------------------------------------- process
def test_incorrect_reward_matters_only_with_the_overlong_penalty():
    """+1/-1 (DAPO) and 1/0 give the same group-normalised advantages, until the overlong penalty is
    added: the penalty's weight relative to the correctness gap halves under +1/-1 (paper 004)."""
    comps = ["\\boxed{51}", "\\boxed{50} and more text", "\\boxed{51} and more", "\\boxed{9}"]
    roll = rollouts([Q1] * 4, comps, ["51"] * 4)  # one group of 4 (a group of 2 normalises to +-1 always)
    score = lambda c, a: [float(f"\\boxed{{{x}}}" in y) for y, x in zip(c, a)]
    lengths = [len(chars(c)) for c in comps]

    def adv(incorrect: float, penalty: bool) -> torch.Tensor:
        dep = OutcomeDeposits(score_fn=score, incorrect=incorrect).deposits(roll)
        if penalty:  # the trainer's rule: the penalty deposits on the last token
            for i, n in enumerate(lengths):
                pen = overlong_penalty(n, 20, 10, 1.0)
                if pen:
                    dep.add(i, n - 1, pen)
        return advantages(dep, lengths, G=4)

    assert torch.allclose(adv(0.0, False), adv(-1.0, False), atol=1e-4)
    assert not torch.allclose(adv(0.0, True), adv(-1.0, True), atol=1e-3)


def test_split_steps_positions():
    toks = ["23", "+", "45", "=", "68", "\n", "68", "-17", "=51", "\n\n", "\\boxed{51}", ""]
    steps = split_steps(toks, "\n")
    assert [(a, b) for a, b, _ in steps] == [(0, 5), (6, 9), (10, 11)]  # closing tokens: "\n", "\n\n", EOS
    assert [t for _, _, t in steps] == ["23+45=68", "68-17=51", "\\boxed{51}"]
    assert split_steps(["a", "\n"], "\n") == [(0, 1, "a")]  # nothing after the last separator
    assert split_steps(["x\ny"], "\n") == [(0, 0, "x"), (0, 0, "y")]  # two steps close on one token
    assert split_steps(["a", "\n\n", "b"], "\n\n") == [(0, 1, "a"), (2, 2, "b")]


def test_safe_parser():
    assert parse_arith("23+45") == 68
    assert parse_arith("2*(3-5)/4") == -1
    assert parse_arith("-18+5") == -13
    for bad in ["__import__('os').system('x')", "2**10", "1/0", "9" * 40, "(" * 30 + "1" + ")" * 30, "", "1+"]:
        with pytest.raises(ParseError):
            parse_arith(bad)
    assert check_equation("23+45=68") == (True, 68)
    assert check_equation("23+45=69") == (False, 69)
    assert check_equation("the answer") == (False, None)
    assert check_equation("1=1=1") == (False, None)


def test_rule_checker_modes():
    steps = ["23+45=68", "1+1=2", "68-17=51", "\\boxed{51}"]
    assert RuleStepChecker("arithmetic").score_one(Q1, steps) == [1.0, 1.0, 1.0, 1.0]
    assert RuleStepChecker("chain").score_one(Q1, steps) == [1.0, 0.0, 0.0, 0.0]  # off-chain from step 2
    assert RuleStepChecker("chain").score_one(Q1, ["23+45=68", "68-17=51", "\\boxed{51}"]) == [1, 1, 1]
    assert RuleStepChecker().score_one(Q1, ["23+45=67", "\\boxed{67}", "hello"]) == [0.0, 0.0, 0.0]
    assert chain_steps(Q1) == ["23+45=68", "68-17=51"] and chain_steps("no question") is None
    with pytest.raises(ValueError):
        RuleStepChecker("magic")


def test_process_2x2_by_hand_never_sees_gold():
    comps = ["23+45=68\n68-17=50\n\\boxed{50}", "23+45=68\n\\boxed{68}", "5+5=10\n\\boxed{10}", "5+5=11"]
    seen = {}

    class Spy(RuleStepChecker):
        def score(self, questions, steps):
            seen["args"] = (questions, steps)
            return super().score(questions, steps)

    r = rollouts([Q1, Q1, Q2, Q2], comps, answers=None)
    dep = ProcessDeposits(Spy()).deposits(r)
    assert seen["args"][0] == [Q1, Q1, Q2, Q2]  # question + steps only (no answers exist here)
    assert dep.positions == [[8, 17, 28], [8, 19], [6, 17], [6]]  # "\n" of each step, then EOS
    assert dep.values == [[1.0, 0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0]]
    lengths = [len(c) + 1 for c in comps]
    adv = advantages(dep, lengths)
    g0, g1 = [1, 0, 0, 1, 1], [1, 1, 0]
    a = [z(g0, v) for v in (1, 0, 0)]
    assert adv[0, 0].item() == pytest.approx(sum(a), abs=1e-5)  # reward-to-go before step 1 closes
    assert adv[0, 9].item() == pytest.approx(a[1] + a[2], abs=1e-5)
    assert adv[0, 28].item() == pytest.approx(a[2], abs=1e-5)
    assert adv[1, 0].item() == pytest.approx(2 * z(g0, 1), abs=1e-5)
    assert adv[2, 0].item() == pytest.approx(2 * z(g1, 1), abs=1e-5)
    assert adv[2, 7].item() == pytest.approx(z(g1, 1), abs=1e-5)
    assert adv[3, 0].item() == pytest.approx(z(g1, 0), abs=1e-5)
    assert adv[3, 7:].abs().max() == 0  # padding


# ----------------------------------------------------------------------------- tiny HF models
@pytest.fixture(scope="module")
def tiny():
    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    tok.add_tokens(["ки"])
    recipe = TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    torch.manual_seed(0)
    model = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id).eval()
    return model, tok, recipe


def test_shepherd_prm_shapes_alignment_batching(tiny):
    model, tok, _ = tiny
    questions = [Q1, Q2, Q1]
    steps = [["23+45=68", "68-17=51", "\\boxed{51}"], ["5+5=10"], []]
    prm = ShepherdPRM(model, tok, batch_size=3)
    scores = prm.score(questions, steps)
    assert [len(s) for s in scores] == [3, 1, 0]
    assert all(0.0 < x < 1.0 for s in scores for x in s)
    # batching and right-padding do not change scores
    single = ShepherdPRM(model, tok, batch_size=1).score(questions, steps)
    for a, b in zip(scores, single):
        assert a == pytest.approx(b, abs=1e-5)
    # step k's score is P(+ | +/-) read at the k-th tag token
    ids = tok.encode(prm.format(Q1, steps[0]))
    tag = tok.convert_tokens_to_ids("ки")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    pos = [i for i, t in enumerate(ids) if t == tag]
    manual = [logits[p, prm.label_ids].softmax(-1)[0].item() for p in pos]
    assert scores[0] == pytest.approx(manual, abs=1e-5)
    # a tag that is not one token is refused
    with pytest.raises(ValueError):
        ShepherdPRM(model, tok, good_token="++x").score(questions, steps)


def test_shepherd_prm_as_process_scorer_and_truncation(tiny):
    model, tok, _ = tiny
    prm = ShepherdPRM(model, tok, max_length=12)
    comps = ["23+45=68\n68-17=51\n\\boxed{51}", "5+5=10"]
    ids = [tok.encode(c) + [tok.eos_token_id] for c in comps]
    r = Rollouts([Q1, Q2], comps, [[1], [1]], ids, decode_tokens(tok, ids))
    dep = ProcessDeposits(prm, tokenizer=tok).deposits(r)
    assert [len(p) for p in dep.positions] == [3, 1]
    assert dep.positions[0][-1] == len(ids[0]) - 1
    assert prm.truncated_steps >= 1 and dep.values[0][-1] == 0.0


def test_teacher_logps_match_a_plain_forward(tiny, tmp_path):
    model, tok, recipe = tiny
    teacher = TeacherScorer(__import__("copy").deepcopy(model), batch_size=2, temperature=0.7,
                            pad_token_id=tok.pad_token_id)
    p = tok.encode("Q: 12+34=?\nA: ")
    comps = [tok.encode("12+34=46"), tok.encode("46"), tok.encode("12")]
    got = teacher.logps([p, p, p], comps)
    for c, g in zip(comps, got):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[0] / 0.7
        lp = logits.log_softmax(-1)
        want = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(c)]
        assert g == pytest.approx(want, abs=1e-5)


def test_tokenizer_check(tiny):
    _, tok, _ = tiny
    from lorarl.models import build_tokenizer

    check_shared_tokenizer(tok, tok)
    other = build_tokenizer(["completely different text corpus"] * 10, vocab_size=280)
    with pytest.raises(ValueError, match="does not share the student's tokenizer"):
        check_shared_tokenizer(tok, other, "other-teacher")


def test_distillation_2x2_by_hand():
    class FakeTeacher:
        def logps(self, prompt_ids, completion_ids):
            return [[-0.5] * len(c) for c in completion_ids]

    r = Rollouts([Q1, Q1, Q2, Q2], ["a", "b", "c", "d"], [[1]] * 4, [[5, 6], [5], [5, 6], [5, 6]],
                 student_logps=[[-1.0, -0.5], [-2.5], [-0.5, -0.5], [-1.0, -0.5]])
    dep = DistillationDeposits(FakeTeacher()).deposits(r)
    assert dep.dense and dep.positions == [[0, 1], [0], [0, 1], [0, 1]]
    assert dep.values == [[0.5, 0.0], [2.0], [0.0, 0.0], [0.5, 0.0]]
    adv = advantages(dep, [2, 1, 2, 2])
    g0, g1 = [0.5, 0.0, 2.0], [0.0, 0.0, 0.5, 0.0]
    want = [[z(g0, 0.5), z(g0, 0.0)], [z(g0, 2.0), 0.0], [z(g1, 0.0), z(g1, 0.0)], [z(g1, 0.5), z(g1, 0.0)]]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-5)
    with pytest.raises(ValueError, match="student_logps"):
        DistillationDeposits(FakeTeacher()).deposits(Rollouts([Q1], ["a"], [[1]], [[5]]))
