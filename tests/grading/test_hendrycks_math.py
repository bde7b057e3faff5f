"""Evalchemy's grader (lorarl.grading.hendrycks_math): hendrycks-MATH's last box and is_equiv, case by case.

Every row's verdict was taken from lm-evaluation-harness's own ``lm_eval/tasks/hendrycks_math/utils.py`` (the
``is_equiv(str(gold), remove_boxed(last_boxed_only_string(output)))`` Evalchemy's AIME24/AIME25/AMC23/MATH500
tasks compute, a bare ``except`` giving ``""``); the last column is math-verify's verdict on the same pair
(lorarl's ``boxed`` format), so the rows where the two graders disagree are pinned too.
"""

from __future__ import annotations

import pytest

from lorarl.grading.answer_formats import ANSWER_FORMATS, extracted_answer, has_answer
from lorarl.grading.benchmarks import EVALCHEMY_TEMPLATE, get_benchmark
from lorarl.grading.hendrycks_math import evalchemy_answer, hendrycks_boxed, is_equiv, strip_string
from lorarl.grading.verify import GradingSettings, score_math_batch

HENDRYCKS = GradingSettings(answer_format="hendrycks_boxed")

# (completion, gold, Evalchemy's extracted answer, is_equiv verdict, math-verify verdict)
CASES = [
    ("The answer is \\boxed{73}.", "73", "73", True, True),
    ("so $z=\\boxed{073}$", "73", "073", False, True),                       # text, not numbers
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", "\\frac{2}{4}", False, True),   # no simplification
    ("\\boxed{0.5}", "\\frac{1}{2}", "0.5", True, True),                      # the one decimal it knows
    ("\\boxed{.5}", "\\frac{1}{2}", ".5", True, True),                        # a leading 0 added first
    ("\\boxed{3.5}", "\\frac{7}{2}", "3.5", False, True),
    ("\\boxed{2.0}", "2", "2.0", False, True),
    ("\\boxed{1/2}", "\\frac{1}{2}", "1/2", True, True),                      # fix_a_slash_b
    ("\\boxed{x/2}", "\\frac{x}{2}", "x/2", False, True),                     # int('x') raises: raw strings compared
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", "\\dfrac12", True, True),          # dfrac -> frac, fix_fracs
    ("\\boxed{x = 5}", "5", "x = 5", True, True),                             # a prefix of <= 2 characters goes
    ("\\boxed{y=5}", "5", "y=5", True, True),
    ("\\boxed{abc=5}", "5", "abc=5", False, True),                            # a longer one stays
    ("\\boxed{10^\\circ}", "10", "10^\\circ", True, True),
    ("\\boxed{50\\%}", "50", "50\\%", True, True),
    ("\\boxed{5 \\text{ cm}}", "5", "5 \\text{ cm}", True, True),              # a right unit after "\text{ "
    ("\\boxed{(3,\\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True, True),
    ("\\boxed{2\\sqrt3}", "2\\sqrt{3}", "2\\sqrt3", True, True),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", True, True),
    ("\\boxed{1,000}", "1000", "1,000", False, True),                          # separators stay
    ("\\boxed{-1}", "-1", "-1", True, True),
    ("\\boxed{3}\\boxed{4}", "4", "4", True, False),                          # the last box alone (math-verify: {3, 4})
    ("\\boxed 7 and then $", "7", "7 and then ", False, False),               # "\boxed " reads up to the next $
    ("\\fbox{12}", "12", "", False, True),                                    # found, but remove_boxed wants \boxed{
    ("\\boxed{42", "42", "", False, False),                                   # unbalanced: no answer
    ("no box: 42", "42", "", False, False),
]


@pytest.mark.parametrize("completion,gold,answer,correct,_mv", CASES)
def test_evalchemy_verdicts(completion, gold, answer, correct, _mv):
    assert evalchemy_answer(completion) == answer
    assert is_equiv(gold, answer) is correct
    got, extracted = hendrycks_boxed(completion, gold)
    assert got is correct
    assert has_answer("hendrycks_boxed", completion) is (extracted is not None)


def test_math_verify_disagrees_where_the_table_says():
    golds, comps = [c[1] for c in CASES], [c[0] for c in CASES]
    mv = [s.correct for s in score_math_batch(golds, comps)]
    assert mv == [c[4] for c in CASES]
    ours = [s.correct for s in score_math_batch(golds, comps, settings=HENDRYCKS)]  # the dispatch of every grader
    assert ours == [c[3] for c in CASES]
    assert sum(a != b for a, b in zip(mv, ours)) == 9


@pytest.mark.parametrize("text,normal", [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("\\tfrac{1}{2}", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}"), ("k = 7", "7"), ("\\$5", "5"),
    ("a\n b", "ab"), ("\\!1", "1"), ("", ""),
])
def test_strip_string(text, normal):
    assert strip_string(text) == normal


def test_raising_normalisations_compare_the_raw_strings():
    assert is_equiv("x/2", "x/2") and not is_equiv("x/2", "x / 2")        # int('x') raised: raw comparison
    assert is_equiv("3\\sqrt", "3\\sqrt") and not is_equiv("3\\sqrt", "3 \\sqrt")  # a trailing \sqrt raises
    assert is_equiv(None, None) and not is_equiv("1", None)


def test_format_is_registered_and_extracts_the_last_box():
    assert "hendrycks_boxed" in ANSWER_FORMATS
    assert extracted_answer("hendrycks_boxed", "\\boxed{1} then \\boxed{2}") == "2"
    assert extracted_answer("hendrycks_boxed", "no box") is None


def test_evalchemy_benchmarks_carry_the_harness_prompt_budget_and_grader():
    for name, n in (("aime24_evalchemy", 10), ("aime25_evalchemy", 10), ("amc23_evalchemy", 10),
                    ("math500_evalchemy", 1)):
        b = get_benchmark(name)
        assert b.harness == "evalchemy" and b.template == EVALCHEMY_TEMPLATE
        assert b.grading.answer_format == "hendrycks_boxed"
        p = b.protocol
        assert (p.max_new_tokens, p.temperature, p.top_p, p.n) == (32768, 0.7, 1.0, n)
        probs = b.load(rows=[b.example])
        assert probs[0].gold == b.example_gold
        assert probs[0].prompt.startswith("Problem: ") and probs[0].prompt.endswith(
            "\nMark your solution with \\boxed\nAnswer:")
    # math-ai/aime24's solution boxes 073; Evalchemy's file says 73 (expected_answer), and is_equiv compares text
    b = get_benchmark("aime24_evalchemy")
    assert b.load(rows=[{"id": "aime24-0", "problem": "p", "expected_answer": "73"}])[0].gold == "73"
    assert b.grade(b.load(rows=[b.example]), ["so \\boxed{73}"])[0].correct


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_cell_asks_and_grades_evalchemy_benchmarks_as_evalchemy(tmp_path):
    """Whatever the cell trains with (its prompt.template, reward.answer_format), an Evalchemy entry puts
    Evalchemy's user message, alone, through the chat template (lm-eval's apply_chat_template with
    add_generation_prompt, no system prompt) and grades with is_equiv."""
    import json

    from lorarl.language.config import CellConfig
    from lorarl.language.evalplan.plan import cell_grading, eval_signature
    from lorarl.evaluate.main import load_problems
    from lorarl.models import build_tokenizer
    from lorarl.tasks.prompt import build_prompt, prompt_ids

    data = tmp_path / "aime.jsonl"
    data.write_text(json.dumps({"id": "aime24-0", "problem": "Find $x$.", "expected_answer": "73"}) + "\n")
    ev = {"benchmarks": {"aime24_evalchemy": {"path": str(data)}, "aime24": {}}}
    cfg = CellConfig(prompt={"template": "Solve: {question}"}, reward={"answer_format": "answer_line"}, eval=ev)
    assert cell_grading(cfg, "aime24_evalchemy").answer_format == "hendrycks_boxed"
    assert cell_grading(cfg, "aime24").answer_format == "answer_line"           # the others follow the reward
    (p,) = load_problems("aime24_evalchemy", cfg)
    assert p.prompt == "Problem: Find $x$.\nMark your solution with \\boxed\nAnswer:" and p.gold == "73"
    tok = build_tokenizer(["Problem: Find x. Mark your solution with boxed Answer:"] * 5, vocab_size=120)
    tok.chat_template = CHAT
    msgs = build_prompt(cfg.prompt, p.prompt, tok)
    assert msgs == [{"role": "user", "content": p.prompt}]
    lm_eval_text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert prompt_ids(tok, msgs, cfg.prompt) == tok(lm_eval_text, add_special_tokens=False)["input_ids"]
    other = CellConfig(prompt={"template": "Solve: {question}"}, eval=ev)     # the reward's format is not its grader
    assert eval_signature(cfg, "aime24_evalchemy", is_base=True) == eval_signature(other, "aime24_evalchemy", is_base=True)
    moved = CellConfig(prompt={"template": "Q: {question}"}, eval=ev)           # the cell's template is not its prompt
    assert eval_signature(moved, "aime24_evalchemy", is_base=True) == eval_signature(other, "aime24_evalchemy", is_base=True)
    assert eval_signature(moved, "aime24", is_base=True) != eval_signature(other, "aime24", is_base=True)


@pytest.mark.parametrize("study,want", [
    ("off_principal_masks", {None: {"aime24_evalchemy": 64, "aime25_evalchemy": 64, "amc23_evalchemy": 32,
                                    "math500_evalchemy": 2}}),
    ("off_principal_lora_pissa", {"dsqwen": {"aime24_evalchemy": 16, "amc23_evalchemy": 16},
                                  "llama": {"math500_evalchemy": 4}}),
])
def test_paper_004_evaluates_as_evalchemy_with_the_papers_samples(study, want):
    """004 App. C.2: Evalchemy at T 0.7 / top-p 0.8; avg@64 (AIME), @32 (AMC), @2 (MATH-500); §5.2: avg@16, mean@4.
    Sampled on vLLM, as Evalchemy's T 0.7 samples only there (lm-eval's HF model runs its do_sample False greedy); the
    CPU twin on HF generate."""
    from pathlib import Path

    from lorarl.language.evalplan.plan import benchmark_specs, cell_grading, protocol_for
    from lorarl.language.study import load_study, study_cells

    experiments = Path(__file__).resolve().parents[2] / "experiments"
    cells = study_cells(load_study(experiments / f"{study}.yaml"))
    assert {c.config.eval.backend for c in study_cells(load_study(experiments / f"{study}_cpu.yaml"))} == {"hf"}
    for c in cells:
        assert c.config.eval.backend == "vllm", c.id
        expected = want.get(c.axes.get("model"), want.get(None))
        specs = benchmark_specs(c.config)
        assert {b: protocol_for(b, s, c.config.eval).n for b, s in specs.items()} == expected
        for b, s in specs.items():
            p = protocol_for(b, s, c.config.eval)
            assert (p.max_new_tokens, p.temperature, p.top_p, p.metric_names[0]) == (32768, 0.7, 0.8, f"avg@{p.n}")
            assert cell_grading(c.config, b).answer_format == "hendrycks_boxed"
