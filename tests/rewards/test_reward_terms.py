"""Reward terms (lorarl.rewards.terms): every registered term on hand-written completions from one table of
cases, the GSM8K GRPO recipe's sum (at most 4.0), the outcome regime depositing the sum, the config's checks
(exit 2 naming reward.terms and the allowed terms), and paper 000's studies: beta weighs 0.05 / 4.0 against
the surrogate, the reading of Fig. 3b's reward "just below 4.0"."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from lorarl.rewards.registry import reward_section
from lorarl.language.config import CellConfig
from lorarl.grading.verify import GradingSettings
from lorarl.rewards import Rollouts
from lorarl.grading.answer_formats import verdict
from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.rewards.registry import build_regime
from lorarl.rewards.terms import (GSM8K_RECIPE, TERMS, TermContext, load_all, register_term, reward_maximum,
                                  reward_scale, score, term_names)
from lorarl.language.signature import signature_dump, train_signature
from lorarl.language.study import load_study, study_cells

ROOT = Path(__file__).resolve().parents[2]
PERFECT = "<reasoning>\nHalf of 48 is 24.\n48 + 24 = 72\n</reasoning>\n<answer>\n72\n</answer>\n"
TRAILING = PERFECT.rstrip("\n") + "\nHope this helps"  # 15 characters after the closing tag's line
ONE_LINE = "<reasoning>48/2 = 24, 48 + 24 = 72</reasoning> <answer>72</answer>"
LATE = "Sure! " + PERFECT  # the layout, but not at the start
NO_TAGS = "Natalia sold 48 + 24 = 72 clips. The answer is 72."
NEGATIVE = "<reasoning>\n5 - 8 = -3\n</reasoning>\n<answer>\n-3\n</answer>\n"

# (term, answer format, completion, gold, the cell's 1/0 verdict, expected value)
CASES = [
    ("correct", "xml_answer", PERFECT, "72", 1.0, 1.0),
    ("correct", "xml_answer", NO_TAGS, "72", 0.0, 0.0),
    ("integer_answer", "xml_answer", PERFECT, "72", 1.0, 1.0),
    ("integer_answer", "xml_answer", NEGATIVE, "-3", 1.0, 0.0),          # the recipe's str.isdigit: no sign
    ("integer_answer", "xml_answer", "<answer>7.5</answer>", "7.5", 1.0, 0.0),
    ("integer_answer", "xml_answer", NO_TAGS, "72", 0.0, 0.0),           # the recipe reads the whole text
    ("integer_answer", "xml_answer", "72", "72", 1.0, 1.0),              # ... which a bare number is
    ("integer_answer", "boxed", "so the total is \\boxed{72}", "72", 1.0, 1.0),
    ("integer_answer", "boxed", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0, 0.0),
    ("integer_answer", "boxed", NO_TAGS, "72", 0.0, 0.0),
    ("strict_format", "xml_answer", PERFECT, "72", 1.0, 1.0),            # several reasoning lines (re.DOTALL)
    ("strict_format", "xml_answer", TRAILING, "72", 1.0, 0.0),
    ("strict_format", "xml_answer", ONE_LINE, "72", 1.0, 0.0),
    ("strict_format", "xml_answer", LATE, "72", 1.0, 0.0),
    ("soft_format", "xml_answer", PERFECT, "72", 1.0, 1.0),              # strict and soft both pay: the 4.0 reading
    ("soft_format", "xml_answer", ONE_LINE, "72", 1.0, 1.0),
    ("soft_format", "xml_answer", TRAILING, "72", 1.0, 1.0),
    ("soft_format", "xml_answer", LATE, "72", 1.0, 0.0),                 # re.match: the layout must start it
    ("soft_format", "xml_answer", NO_TAGS, "72", 0.0, 0.0),
    ("xml_count", "xml_answer", PERFECT, "72", 1.0, 1.0),
    ("xml_count", "xml_answer", TRAILING, "72", 1.0, 2 * (0.5 - 0.015 - 0.015)),  # 0.001 per trailing char, twice
    ("xml_count", "xml_answer", ONE_LINE, "72", 1.0, 0.0),
    ("xml_count", "xml_answer", "<reasoning>\nx\n</reasoning>\n", "72", 0.0, 0.5),
    ("xml_count", "xml_answer", PERFECT + PERFECT, "72", 1.0, 0.0),      # every tag twice: none counts
]


def test_the_table_covers_every_registered_term():
    assert {c[0] for c in CASES} == set(term_names()) == {"correct", "integer_answer", "strict_format",
                                                          "soft_format", "xml_count"}


@pytest.mark.parametrize("term, fmt, completion, gold, ok, want", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_term_on_a_hand_written_completion(term, fmt, completion, gold, ok, want):
    got = load_all()[term].fn([completion], [gold], TermContext(fmt, [ok]))
    assert got == [pytest.approx(want)]


def test_xml_answer_is_the_recipes_rule():
    assert verdict("xml_answer", PERFECT, "72") == (True, "72")
    assert verdict("xml_answer", PERFECT, "73") == (False, "72")
    assert verdict("xml_answer", "<answer> 1,000 </answer>", "1000") == (False, "1,000")  # exact text
    assert verdict("xml_answer", NO_TAGS, "72") == (False, None)
    assert verdict("xml_answer", "<answer>3</answer> then <answer>\n4\n</answer>", "4") == (True, "4")  # the last


def _ctx(completions, golds, fmt="xml_answer"):
    return TermContext(fmt, [1.0 if verdict(fmt, c, g)[0] else 0.0 for c, g in zip(completions, golds)])


def test_the_recipe_pays_at_most_4():
    assert reward_maximum(GSM8K_RECIPE) == 4.0
    completions = [PERFECT, TRAILING, ONE_LINE, LATE, NO_TAGS, NEGATIVE, "72", PERFECT + PERFECT]
    golds = ["72"] * 5 + ["-3", "72", "72"]
    totals, per_term = score(GSM8K_RECIPE, completions, golds, _ctx(completions, golds))
    assert totals[0] == 4.0 and max(totals) == 4.0
    assert totals[1] == pytest.approx(2.0 + 0.5 + 0.5 + 0.5 * 0.94)       # trailing text: no strict, xml_count -
    assert totals[2] == 2.0 + 0.5 + 0.5                                     # one line: soft only
    assert totals[4] == 0.0
    assert totals[5] == pytest.approx(2.0 + 0.5 + 0.5 + 0.5)                # right, but not an integer by isdigit
    assert set(per_term) == set(GSM8K_RECIPE) and all(len(v) == len(completions) for v in per_term.values())


def test_the_outcome_regime_deposits_the_weighted_sum_on_the_last_token():
    regime = build_regime(reward_section({"answer_format": "xml_answer", "terms": GSM8K_RECIPE}), tokenizer=None)
    assert isinstance(regime, OutcomeDeposits) and regime.terms == GSM8K_RECIPE
    completions = [PERFECT, ONE_LINE, NO_TAGS]
    rollouts = Rollouts(prompts=["q"] * 3, completions=completions, prompt_ids=[[1]] * 3,
                        completion_ids=[[5, 6, 7], [5, 6], [5]], answers=["... #### 72"] * 3)
    dep = regime.deposits(rollouts)
    assert dep.positions == [[2], [1], [0]]
    assert dep.totals == [4.0, 3.0, 0.0]
    assert regime.last_correct == [1.0, 1.0, 0.0]  # the grade stays the accuracy metric (and the correct term)
    assert regime.last_terms["soft_format"] == [1.0, 1.0, 0.0]
    plain = OutcomeDeposits(settings=GradingSettings(answer_format="xml_answer"))  # no terms: the 1/0 grade
    assert plain.deposits(rollouts).totals == [1.0, 1.0, 0.0]


def test_a_term_is_registered_once_with_a_checked_spec():
    with pytest.raises(ValueError, match="registered twice"):
        register_term("correct")(lambda c, g, ctx: [])
    with pytest.raises(ValueError, match="maximum must be a positive number"):
        register_term("zero_max_probe", maximum=0.0)(lambda c, g, ctx: [])
    assert "zero_max_probe" not in TERMS


@pytest.mark.parametrize("reward, match", [
    ({"terms": {"corect": 2.0}}, r"unknown reward term\(s\) 'corect' in reward.terms; allowed: correct, integer_answer, "
                                 r"soft_format, strict_format, xml_count"),
    ({"terms": {}}, r"reward.terms is empty"),
    ({"terms": {"correct": float("inf")}}, r"reward.terms.correct: the weight must be a finite number"),
    ({"terms": {"correct": 1.0}, "regime": "process"}, r"reward.terms applies to reward.regime 'outcome'"),
    ({"terms": {"correct": 1.0}, "incorrect_reward": -1.0}, r"allowed with terms: incorrect_reward 0"),
])
def test_bad_terms_are_refused_naming_the_field(reward, match):
    with pytest.raises(ValidationError, match=match):
        CellConfig(reward=reward)


def test_a_study_with_an_unknown_term_exits_2(tmp_path, capsys):
    from lorarl.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndefaults:\n  model: local:tiny-test\n  reward:\n    terms: {correct: 2.0, xml_cnt: 0.5}\n")
    assert main(["cells", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "reward.terms" in err and "xml_cnt" in err and "allowed: correct, integer_answer" in err
    assert not (tmp_path / "results").exists()


def test_terms_enter_the_signature_only_when_set():
    assert "terms" not in signature_dump(CellConfig())["reward"]  # cells before the field keep their hash
    with_terms = CellConfig(reward={"terms": GSM8K_RECIPE})
    assert signature_dump(with_terms)["reward"]["terms"] == GSM8K_RECIPE
    assert train_signature(with_terms) != train_signature(CellConfig())


@pytest.mark.parametrize("study", ["kl_free", "kl_free_gemma_ablation"])
def test_paper_000_beta_weighs_a_4_point_reward(study):
    """Paper 000: A = r - mean(r) (scale_rewards none), so the surrogate scales with the reward; its reward tops
    out just below 4.0 (Fig. 3b): beta 0.05 weighs 0.05 / 4.0 against it (the 1/0 reward made it 0.05)."""
    cells = study_cells(load_study(ROOT / "experiments" / f"{study}.yaml"))
    kl = [c for c in cells if c.config.train.beta > 0]
    assert kl and len(kl) < len(cells)
    for c in cells:
        assert c.config.train.scale_rewards == "none" and reward_scale(c.config.reward) == 4.0, c.id
        assert c.config.reward.answer_format == "xml_answer" and "<answer>" in c.config.prompt.system
    for c in kl:
        assert c.config.train.beta / reward_scale(c.config.reward) == pytest.approx(0.05 / 4.0), c.id


@pytest.mark.parametrize("twin", ["kl_free_cpu", "kl_free_gemma_ablation_cpu"])
def test_the_cpu_twins_keep_the_studys_terms(twin):
    study = study_cells(load_study(ROOT / "experiments" / f"{twin[:-4]}.yaml"))[0].config.reward.terms
    for c in study_cells(load_study(ROOT / "experiments" / f"{twin}.yaml")):
        assert c.config.reward.terms == study == GSM8K_RECIPE, c.id
