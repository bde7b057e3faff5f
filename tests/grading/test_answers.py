"""Which boxes are graded and how digit separators are read (lorarl.grading.answers, pure strings), and the
same rules end to end through math-verify (lorarl.grading.verify): one table row per case class."""

from __future__ import annotations

import pytest

from lorarl.grading.answers import (final_boxed, gold_boxes, normalize_separators, prepare_completion)
from lorarl.grading.verify import score_math, score_math_batch
from lorarl.rewards.outcome import gold_answer

LONG = " Then we carry on with a long computation over several more lines of prose. "


@pytest.mark.parametrize("text, boxes", [
    # several boxes next to each other: one answer (math-verify joins them)
    (r"\boxed{1} and \boxed{2}", ["1", "2"]),
    (r"\boxed{(2,2)}, \boxed{(6,2)}", ["(2,2)", "(6,2)"]),
    (r"\boxed{x=1}; \boxed{x=2}; \boxed{x=3}", ["x=1", "x=2", "x=3"]),
    (r"\boxed{1}\boxed{2}", ["1", "2"]),
    (r"x is \boxed{1} or, when n is even, \boxed{2}", ["1", "2"]),     # < 70 chars with "or"
    # intermediate results far before the final box: only the final box
    (r"a = \boxed{3}." + LONG + r"So \boxed{7}", ["7"]),
    (r"\boxed{3} is the first step of a long argument without any separator, \boxed{7}",
     ["3", "7"]),                                       # 10-70 chars with a comma: joined
    (r"\boxed{3} is the first step of a long argument without any separator at all \boxed{7}",
     ["7"]),                                            # 10-70 chars, no separator: not joined
    (r"\boxed{7} then restated, \boxed{7}", ["7"]),     # identical contents count once
    (r"\boxed{\boxed{8}}", ["8"]),                      # nested: the inner one
    (r"\boxed{3} and a truncated \boxed{4", ["3"]),     # unclosed tail skipped
    ("no box", []),
])
def test_final_boxed(text, boxes):
    assert final_boxed(text) == boxes


@pytest.mark.parametrize("text, boxes", [
    (r"so $x=\boxed{1}$." + LONG + r"Also $x = \boxed{2}$ works.", ["1", "2"]),  # all kept
    (r"\boxed{(2,2)} and \boxed{(6,2)}", ["(2,2)", "(6,2)"]),
    (r"\boxed{5} ... hence \boxed{5}", ["5"]),
    (r"\boxed{\boxed{8}}", ["8"]),
    ("42", []),
])
def test_gold_boxes(text, boxes):
    assert gold_boxes(text) == boxes


def test_gold_answer_keeps_every_box():
    assert gold_answer(r"First \boxed{1}." + LONG + r"Second \boxed{2}.") == "1,2"
    assert gold_answer(r"$\boxed{\frac{1}{2}}$") == r"\frac{1}{2}"
    assert gold_answer("He has 3+39=<<3+39=42>>42.\n#### 1,042") == "1042"


@pytest.mark.parametrize("latex, expected", [
    (r"1\,000", "1000"), (r"1 \, 000", "1000"), (r"12\,345\,678", "12345678"),
    (r"1\;000", "1000"), (r"1\:000", "1000"), (r"1\ 000", "1000"), (r"1~000", "1000"),
    (r"1\thinspace 000", "1000"), ("1\u2009000", "1000"), ("1\u202f000", "1000"),
    ("1\u00a0000", "1000"), ("1 000", "1000"), ("1 000 000", "1000000"), (r"1{\,}000", "1000"),
    (r"3.141\,592", "3.141592"), (r"-12 345", "-12345"),
    (r"1{,}000", "1000"), (r"1{,}000{,}000", "1000000"),       # {,} between groups of 3
    (r"2{,}5", "2.5"), (r"3{,}14", "3.14"), (r"12\,345{,}6", "12345.6"),   # decimal commas
    # left alone: real lists, plain commas (math-verify reads 1,000 itself), non-groups
    ("1,2,3", "1,2,3"), ("1,000", "1,000"), ("2,5", "2,5"), ("(1, 000)", "(1, 000)"),
    ("1 2 3", "1 2 3"), ("12 34", "12 34"), ("1000 0", "1000 0"), (r"x\,y", r"x\,y"),
    (r"2\,\text{cm}", r"2\,\text{cm}"), (r"\{1, 2\}", r"\{1, 2\}"), (r"10^{3}\,000", r"10^{3}\,000"),
])
def test_normalize_separators(latex, expected):
    assert normalize_separators(latex) == expected


def test_prepare_completion_touches_only_box_contents():
    text = r"We get 1\,000 apples, so \boxed{1\,000} and \fbox{2{,}5} then \boxed{3"
    assert prepare_completion(text) == r"We get 1\,000 apples, so \boxed{1000} and \boxed{2.5} then "
    assert prepare_completion("no box") is None


# gold, completion, correct, graded text (Score.extracted)
GRADE_TABLE = [
    # 1. several boxes in one completion: graded as the set
    ("1,2", r"So $x = 1$ gives \boxed{x=1} and $x=2$ gives \boxed{x = 2}.", True, "x=1,x = 2"),
    ("1,2", r"The roots are \boxed{1} and \boxed{2}.", True, "1,2"),
    (r"\{1, 2\}", r"roots \boxed{2}, \boxed{1}", True, "2,1"),
    ("(2,2),(6,2)", r"\boxed{(2,2)} and \boxed{(6,2)}", True, "(2,2),(6,2)"),
    (r"\{(2,2),(6,2)\}", r"\boxed{(6,2)}, \boxed{(2,2)}", True, "(6,2),(2,2)"),
    ("(2,2),(6,2)", r"\boxed{(2,2)}", False, "(2,2)"),                 # half the set is wrong
    ("1", r"\boxed{1} and \boxed{2}", False, "1,2"),                   # extra answers are wrong
    ("1,2", r"$x=\boxed{1}$, $x=\boxed{2}$", True, "1,2"),            # math environments chained
    ("1,2", r"$\boxed{1}$ or $\boxed{2}$", True, "1,2"),
    ("1,2", r"\boxed{1} \text{ and } \boxed{2}", True, "1,2"),
    ("-1,2", r"\boxed{x=-1} \quad \boxed{x=2}", True, "x=-1,x=2"),
    ("1,2", r"\fbox{1} and \fbox{2}", True, "1,2"),                 # \fbox counts as \boxed
    ("5", r"\boxed{5}\boxed{5}", True, "5"),                          # a repeated box once
    ("3", r"\boxed{3} and the truncated \boxed{\frac{1}", True, "3"),
    #    intermediate boxes, then the final answer: only the final answer
    ("7", r"First $a = \boxed{3}$." + LONG + r"Hence the answer is $\boxed{7}$.", True, "7"),
    ("7", r"First a = \boxed{3}." + LONG + r"Hence \boxed{7}.", True, "7"),
    ("7", r"$a=\boxed{3}$, $b=\boxed{4}$, so $a+b=\boxed{7}$", True, "7"),   # last $...$ only
    ("7", r"a=\boxed{3}, b=\boxed{4}, so a+b=\boxed{7}", False, "3,4,7"),    # no $: joined
    # 2. golds with several boxes keep all of them
    (r"\boxed{1}" + LONG + r"\boxed{2}", r"\boxed{1}, \boxed{2}", True, "1,2"),
    (r"\boxed{1}" + LONG + r"\boxed{2}", r"\boxed{2}", False, "2"),
    (r"$\boxed{(2,2)}$ and $\boxed{(6,2)}$", r"\boxed{\{(2,2), (6,2)\}}", True, r"\{(2,2), (6,2)\}"),
    # 3. digit separators, without turning lists into numbers
    ("1000", r"\boxed{1\,000}", True, "1000"),
    ("1000", r"\boxed{1{,}000}", True, "1000"),
    ("1000", r"\boxed{1 000}", True, "1000"),
    ("1000000", r"\boxed{1\,000\,000}", True, "1000000"),
    ("1000", "\\boxed{1\u2009000}", True, "1000"),
    ("2.5", r"\boxed{2{,}5}", True, "2.5"),
    ("12345.6", r"\boxed{12\,345{,}6}", True, "12345.6"),
    (r"1\,000", r"\boxed{1000}", True, "1000"),                          # gold side too
    ("1,2,3", r"\boxed{1,2,3}", True, "1,2,3"),                          # a list stays a list
    ("100, 200", r"\boxed{100, 200}", True, "100, 200"),
    ("0.75", r"\boxed{0{,}75}", True, "0.75"),
    ("1000", r"\boxed{1\,000 \text{ dollars}}", True, r"1000 \text{ dollars}"),
    ("123", r"\boxed{1,2,3}", False, "1,2,3"),
    ("1000", r"\boxed{1,000}", True, "1,000"),                           # math-verify's own rule
    ("2.5", r"\boxed{2,5}", False, "2,5"),                               # plain comma: a list
    ("0", r"\boxed{1\,000}", False, "1000"),
]


@pytest.mark.parametrize("gold, completion, correct, graded", GRADE_TABLE)
def test_grade_table(gold, completion, correct, graded):
    s = score_math(gold, completion)
    assert (s.correct, s.extracted, s.timed_out) == (correct, graded, False)


def test_grade_table_in_one_batch():
    scores = score_math_batch([g for g, *_ in GRADE_TABLE], [c for _, c, *_ in GRADE_TABLE])
    assert [s.correct for s in scores] == [c for _, _, c, _ in GRADE_TABLE]


def test_reward_path_grades_multi_answer_solutions_as_sets():
    """rewards.outcome: a MATH-style solution gold with two boxes rewards the full set only."""
    from lorarl.rewards.outcome import grade

    solution = r"Factor: $(x-1)(x-2)=0$, so $x=\boxed{1}$." + LONG + r"Or $x = \boxed{2}$."
    completions = [r"\boxed{1} and \boxed{2}", r"\boxed{2}", r"\boxed{1, 2}", r"\boxed{1 000}"]
    rewards = grade(completions, [solution] * 3 + ["1000"])
    assert rewards == [1.0, 0.0, 1.0, 1.0]
