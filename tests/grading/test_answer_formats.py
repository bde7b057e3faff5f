"""Answer formats (issue 11): DAPO's last "Answer:" line and verl's flexible GSM8K rule, table-driven
against the reference rules (verl math_dapo.compute_score / gsm8k.compute_score(method="flexible")),
`reward.answer_format` + `reward.grading` in the training reward and its hash, and one verdict for a
completion in training and in evaluation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lorarl.language.config import CellConfig
from lorarl.evaluate.backends import Completion
from lorarl.grading.benchmarks import get_benchmark
from lorarl.language.evalplan.plan import cell_grading, eval_signature
from lorarl.evaluate.records import grade_samples
from lorarl.grading.verify import GradingSettings, score_math_batch
from lorarl.rewards import Rollouts
from lorarl.rewards.registry import build_regime
from lorarl.grading.answer_formats import answer_line, last_number, normalize_final_answer
from lorarl.language.signature import train_signature

TAIL = "\n" + "x" * 300  # pushes an earlier line out of DAPO's 300-character window


@pytest.mark.parametrize("completion, gold, correct, extracted", [
    ("so the total is 42.\nAnswer: 42", "42", True, "42"),
    ("ANSWER: 42", "42", True, "42"),                                  # case-insensitive
    ("answer : $\\frac{1}{2}$", "\\frac{1}{2}", True, "\\frac{1}{2}"),  # $...$ dropped
    ("Answer: \\frac12", "\\frac{1}{2}", True, "\\frac{1}{2}"),        # \fracab -> \frac{a}{b}
    ("Answer: 3\nwait, no.\nAnswer: 5", "5", True, "5"),              # the last line wins
    ("Answer: 3\nwait, no.\nAnswer: 5", "3", False, "5"),
    ("Answer: x = 7", "7", True, "7"),                                 # the part after the last =
    ("Answer: 1,000", "1000", True, "1000"),                           # thousands commas of integers
    ("Answer: 10 degrees", "10", True, "10"),                          # units removed
    ("Answer: \\boxed{42}", "42", True, "42"),                         # a box inside the line unwrapped
    ("Answer: \\text{(B)}", "(B)", True, "(B)"),
    ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),                     # strings, no symbolic compare
    ("Answer: 42.", "42", False, "42."),                               # DAPO keeps a final period
    ("the answer is \\boxed{42}", "42", False, None),                  # no Answer: line, no answer
    ("Answer: 42" + TAIL, "42", False, None),                          # outside the last 300 chars
    ("", "42", False, None),
])
def test_answer_line_rule(completion, gold, correct, extracted):
    assert answer_line(completion, gold) == (correct, extracted)
    s = score_math_batch([gold], [completion], settings=GradingSettings(answer_format="answer_line"))[0]
    assert (s.correct, s.extracted, s.timed_out) == (correct, extracted, False)


@pytest.mark.parametrize("raw, normal", [
    ("$x = \\frac{3}{4}$", "\\frac{3}{4}"), ("5 dollars", "5"), ("\\text{Monday}", "Monday"),
    ("90^\\circ", "90"), ("1{,}000", "1000"), ("\\sqrt2", "\\sqrt{2}"), ("\\overline{AB}", "AB"),
    ("a banana", "banana"), ("(1, 2)", "(1,2)"), ("  -3 ", "-3"),
])
def test_minerva_normalisation(raw, normal):
    assert normalize_final_answer(raw) == normal


@pytest.mark.parametrize("completion, gold, correct, extracted", [
    ("She has 3 + 15 = 18 apples.", "18", True, "18"),               # a lone "." is skipped
    ("#### 72", "72", True, "72"),
    ("It drops to -3 degrees", "-3", True, "-3"),
    ("The answer is 42.", "42", False, "42."),                        # verl keeps the period
    ("1,000 in total", "1000", False, "1,000"),                       # and the comma
    ("no digits here", "5", False, None),
])
def test_last_number_rule(completion, gold, correct, extracted):
    assert last_number(completion, gold) == (correct, extracted)
    s = score_math_batch([gold], [completion], settings=GradingSettings(answer_format="last_number"))[0]
    assert (s.correct, s.extracted) == (correct, extracted)


def test_bad_answer_format_names_field_and_values():
    with pytest.raises(ValidationError, match="answer_format") as err:
        CellConfig(reward={"answer_format": "final_line"})
    assert "'boxed', 'answer_line', 'last_number', 'xml_answer', 'xml_math' or 'hendrycks_boxed'" in str(err.value)
    with pytest.raises(ValueError, match="answer_format must be one of boxed, answer_line, last_number"):
        GradingSettings(answer_format="final_line")
    with pytest.raises(ValidationError, match="reward.grading.strict applies to answer_format boxed / xml_math only"):
        CellConfig(reward={"answer_format": "answer_line", "grading": {"strict": False}})
    with pytest.raises(ValidationError, match="eval.benchmarks.math500.grading.float_rounding"):
        CellConfig(reward={"answer_format": "answer_line"},
                   eval={"benchmarks": {"math500": {"grading": {"float_rounding": 3}}}})


def test_reward_settings_are_in_the_training_hash():
    base = CellConfig()
    assert train_signature(CellConfig(reward={"answer_format": "answer_line"})) != train_signature(base)
    assert train_signature(CellConfig(reward={"grading": {"float_rounding": 3}})) != train_signature(base)
    assert train_signature(CellConfig(reward={"grading": {}})) == train_signature(base)


def test_reward_grading_reaches_the_training_reward():
    comps = ["\\boxed{3.1416}", "\\boxed{3.2}"]
    r = Rollouts(prompts=["q", "q"], completions=comps, prompt_ids=[[1], [1]], completion_ids=[[5], [5]],
                 answers=["3.14159", "3.14159"])
    assert build_regime(CellConfig().reward, None).deposits(r).values == [[0.0], [0.0]]
    loose = CellConfig(reward={"grading": {"float_rounding": 3}}).reward
    assert build_regime(loose, None).deposits(r).values == [[1.0], [0.0]]


# completions where the two formats disagree: a box with no Answer: line, a line with no box, both
COMPLETIONS = ["Let me compute.\nAnswer: 34", "So the sum is \\boxed{34}.", "\\boxed{12}\nAnswer: 34",
               "Answer: 34\n\\boxed{12}", "Answer: 35", "Answer: 34" + TAIL]


@pytest.mark.parametrize("fmt", ["boxed", "answer_line"])
def test_training_and_evaluation_give_one_verdict(fmt):
    """The reward the trainer deposits and the evaluation verdict of the same completion agree, for
    the study's answer format; evaluation follows reward.answer_format without being told."""
    cfg = CellConfig(task={"name": "dataset", "path": "x.jsonl"}, reward={"answer_format": fmt},
                     eval={"benchmarks": ["math500"]})
    n = len(COMPLETIONS)
    r = Rollouts(prompts=["q"] * n, completions=COMPLETIONS, prompt_ids=[[1]] * n, completion_ids=[[5]] * n,
                 answers=["34"] * n)
    train = [v[0] == 1.0 for v in build_regime(cfg.reward, None).deposits(r).values]
    bench = get_benchmark("math500")
    problems = bench.load(rows=[{"problem": f"p{i}", "answer": "34", "unique_id": f"u{i}"} for i in range(n)])
    samples = grade_samples(bench, problems, [[Completion(c, 5, False)] for c in COMPLETIONS],
                            grading=cell_grading(cfg, "math500"))
    assert train == [s.correct for s in samples]
    expected = {"boxed": [False, True, False, False, False, False],
                "answer_line": [True, False, True, True, False, False]}[fmt]
    assert train == expected


def test_benchmark_answer_format_override_and_signatures():
    """Paper 003: MATH500/AIME by DAPO's Answer: line, GSM8K by its last number."""
    cfg = CellConfig(reward={"answer_format": "answer_line"},
                     eval={"benchmarks": {"gsm8k": {"answer_format": "last_number"}, "math500": {}, "gpqa": {}}})
    assert cell_grading(cfg, "math500").answer_format == "answer_line"
    assert cell_grading(cfg, "gsm8k").answer_format == "last_number"
    assert cell_grading(cfg, "gpqa") == get_benchmark("gpqa").grading     # letters: no answer format
    plain = CellConfig(eval={"benchmarks": {"gsm8k": {}, "math500": {}, "gpqa": {}}})
    for bench, differs in [("math500", True), ("gsm8k", True), ("gpqa", False)]:  # gpqa: letters as before
        assert (eval_signature(cfg, bench, is_base=True) != eval_signature(plain, bench, is_base=True)) is differs


def test_incorrect_reward_is_dapos_minus_one_and_accuracy_stays_a_rate():
    comps = ["Answer: 34", "Answer: 35", "nothing"]
    r = Rollouts(prompts=["q"] * 3, completions=comps, prompt_ids=[[1]] * 3, completion_ids=[[5, 6]] * 3,
                 answers=["34"] * 3)
    cfg = CellConfig(reward={"answer_format": "answer_line", "incorrect_reward": -1.0})
    regime = build_regime(cfg.reward, None)
    dep = regime.deposits(r)
    assert dep.values == [[1.0], [-1.0], [-1.0]] and dep.positions == [[1]] * 3
    assert regime.last_correct == [1.0, 0.0, 0.0]          # what the trainer logs as accuracy
    assert train_signature(cfg) != train_signature(CellConfig(reward={"answer_format": "answer_line"}))
    with pytest.raises(ValidationError, match="incorrect_reward"):
        CellConfig(reward={"incorrect_reward": 0.5})


@pytest.mark.parametrize("name", ["init_geometry", "init_geometry_7b"])
def test_paper_003_studies_ask_and_grade_as_dapo(name):
    """Paper 003 trains on DAPO-Math's instructed prompt with verl's DAPO reward (last Answer: line,
    +1/-1) and scores GSM8K by flexible numerical extraction (App. C.1-C.2)."""
    from pathlib import Path

    from lorarl.language.study import cell_table, load_study
    from lorarl.tasks.prompt import DAPO_TEMPLATE

    table = cell_table(load_study(Path(__file__).parents[2] / "experiments" / f"{name}.yaml"))
    for cell in table.cells + table.bases:
        cfg = cell.config
        assert cfg.prompt.template == DAPO_TEMPLATE and cfg.task.prompt_rendered
        assert (cfg.reward.answer_format, cfg.reward.incorrect_reward) == ("answer_line", -1.0)
        formats = {b: cell_grading(cfg, b).answer_format for b in cfg.eval.benchmarks}
        assert formats == {"gsm8k": "last_number", "math500": "answer_line", "aime22": "answer_line",
                           "aime23": "answer_line", "aime24": "answer_line"}
    assert table.base_ids == ["base"]


@pytest.mark.parametrize("fmt,completion,answered", [
    ("boxed", r"so \boxed{4}", True),
    ("boxed", "Answer: 4", False),                      # the training metric follows the reward's format:
    ("answer_line", "Answer: 4", True),                 # an Answer: line is an answer under answer_line
    ("answer_line", r"so \boxed{4}", False),           # and a box alone is not
    ("answer_line", "Answer: 4" + "x" * 400, False),    # DAPO reads only the last 300 characters
    ("last_number", "it is 12.", True),
    ("last_number", "no digits here.", False),
])
def test_frac_answered_counts_what_the_format_reads(fmt, completion, answered):
    from lorarl.grading.answer_formats import has_answer

    assert has_answer(fmt, completion) is answered
    with pytest.raises(ValueError, match="allowed: boxed, answer_line, last_number"):
        has_answer("nope", completion)
