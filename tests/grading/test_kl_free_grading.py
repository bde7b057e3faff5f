"""Paper 000's benchmarks graded in the format its study trains (experiments/kl_free.yaml): the GSM8K GRPO
recipe's ``<reasoning>...</reasoning><answer>...</answer>``. GPQA reads the letter inside ``<answer>``, MATH-500
is math-verify on the ``<answer>`` text (xml_math), GSM8K the recipe's exact text (xml_answer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.language.config import CellConfig
from lorarl.language.evalplan.plan import cell_grading
from lorarl.evaluate.records import Sample, summarize_samples
from lorarl.grading.benchmarks import get_benchmark
from lorarl.grading.protocols import Protocol
from lorarl.language.study import load_study, study_cells

ROOT = Path(__file__).resolve().parents[2]


def recipe(answer: str) -> str:
    """A completion in the recipe's format (what its strict_format term pays)."""
    return f"<reasoning>\nSome working.\n</reasoning>\n<answer>\n{answer}\n</answer>\n"


@pytest.fixture(scope="module")
def cfg():
    cells = study_cells(load_study(ROOT / "experiments" / "kl_free.yaml"))
    assert {c.config.reward.answer_format for c in cells} == {"xml_answer"}
    return cells[0].config


def test_the_study_grades_each_benchmark_in_the_trained_format(cfg):
    assert cell_grading(cfg, "gsm8k").answer_format == "xml_answer"   # the training reward's exact rule
    assert cell_grading(cfg, "gpqa").answer_format == "xml_answer"    # the letter grader reads the span
    assert cell_grading(cfg, "math500").answer_format == "xml_math"   # math-verify on the span


def test_the_gemma_ablation_grades_as_it_trains():
    """Paper 000's other study (Fig. 3) evaluates GSM8K only, by the reward's rule; its format's span reaches GPQA
    from the format alone (SPANS), so a GPQA entry added to it would read the letter in <answer> too."""
    cells = study_cells(load_study(ROOT / "experiments" / "kl_free_gemma_ablation.yaml"))
    assert {(c.config.reward.answer_format, cell_grading(c.config, "gsm8k").answer_format) for c in cells} \
        == {("xml_answer", "xml_answer")}
    data = cells[0].config.model_dump()
    data["eval"]["benchmarks"] = {"gsm8k": {}, "gpqa": {}}
    assert cell_grading(CellConfig.model_validate(data), "gpqa").answer_format == "xml_answer"


def test_gpqa_reads_the_letter_inside_the_answer_tag(cfg):
    bench = get_benchmark("gpqa")
    (p,) = bench.load(rows=[bench.example])
    assert p.gold == "D"
    cases = [  # (completion, correct, extracted letter)
        (recipe("D"), True, "D"),
        (recipe("(D) electron"), True, "D"),
        (recipe("\\boxed{D}"), True, "D"),
        (recipe("The answer is D."), True, "D"),
        (recipe("**D**"), True, "D"), (recipe("[D]"), True, "D"), (recipe("Option D"), True, "D"),   # chat models' ways
        (recipe("D."), True, "D"), (recipe("An electron"), False, None), (recipe("Option E"), False, None),
        (recipe("C"), False, "C"),
        (recipe("B") + "\nThe answer is D", False, "B"),         # the tag is the answer, not later prose
        (recipe("electrons") + " so the answer is D", True, "D"),  # neither letter nor option in the tag: the whole text
        ("<reasoning>\nthe answer is (D)\n</reasoning>", True, "D"),  # no tag: boxed / "answer is X" as before
        (recipe("electron"), True, "D"), (recipe("Photon."), False, "B"),  # the option's text (tests/grading/test_option_text.py)
        (recipe("positron"), False, None),
    ]
    scores = bench.grade([p] * len(cases), [c for c, _, _ in cases], settings=cell_grading(cfg, "gpqa"))
    assert [(s.correct, s.extracted) for s in scores] == [(ok, letter) for _, ok, letter in cases]
    before = bench.grade([p], [recipe("D")])[0]   # the registry's letter grader alone: format, not reasoning
    assert (before.correct, before.extracted) == (False, None)


# MATH-500 answers equal to their gold as a policy writes them in the tag: the forms (a final full stop, a
# dfrac, $...$, a point without \\left/\\right) and the other ways a sentence or math mode wraps one
EQUIVALENT = [("\\frac{14}{3}", "14/3"), ("\\frac{14}{3}", "\\dfrac{14}{3}"), ("\\frac{14}{3}", "$\\frac{14}{3}$"),
              ("\\frac{14}{3}", "\\frac{14}{3}"), ("\\frac{14}{3}", "\\boxed{\\frac{14}{3}}"), ("10", "10."), ("10", "10"),
              ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"), ("2\\sqrt{5}", "2 \\sqrt{5}"), ("5", "x = 5"),
              ("\\frac{14}{3}", "\\frac{14}{3}."), ("\\frac{14}{3}", "$\\frac{14}{3}$."), ("\\frac{14}{3}", "\\[\\frac{14}{3}\\]"),
              ("\\frac{14}{3}", "The answer is $\\frac{14}{3}$.")]


def math500_rows(golds):
    bench = get_benchmark("math500")
    return [{**bench.example, "answer": g, "unique_id": f"test/{i}.json"} for i, g in enumerate(golds)]


def test_math500_is_math_verify_on_the_answer_tag(cfg):
    bench = get_benchmark("math500")
    probs = bench.load(rows=math500_rows([g for g, _ in EQUIVALENT]))
    graded = bench.grade(probs, [recipe(a) for _, a in EQUIVALENT], settings=cell_grading(cfg, "math500"))
    assert all(s.correct for s in graded), [(a, s) for (_, a), s in zip(EQUIVALENT, graded) if not s.correct]
    exact = bench.grade(probs, [recipe(a) for _, a in EQUIVALENT], settings=cell_grading(cfg, "gsm8k"))
    assert sum(s.correct for s in exact) == 2   # the recipe's exact text accepts only the gold as written
    wrong = bench.grade(probs[:4], [recipe("\\frac{13}{3}"), "no tag, \\boxed{\\frac{14}{3}}", recipe("$x$ and $y$"),
                                    recipe("14/3 or 13/3")], settings=cell_grading(cfg, "math500"))
    assert [(s.correct, s.extracted) for s in wrong] == [(False, "\\frac{13}{3}"), (False, None), (False, "y"),
                                                          (False, "14/3 or 13/3")]


def test_the_evaluation_stage_grades_recipe_completions(cfg, tmp_path, monkeypatch, capsys):
    """The kl_free study's own cell through lorarl.evaluate (problems, prompts, protocol, grading, records): a
    scripted policy answering in the recipe's format, GPQA and MATH-500 rows in their hub schema; then
    `lorarl rescore` of the records: the same verdicts, and records written before the choices were kept
    (none stored) graded on letters only, as they were, with a line saying so."""
    import json

    import yaml

    import lorarl.evaluate.main as ev
    from lorarl.evaluate.backends import Completion

    gpqa = get_benchmark("gpqa").example
    volts = {"Correct Answer": "2.50 eV", **{f"Incorrect Answer {k}": v for k, v in zip((1, 2, 3), ("1.2 eV", "3.1 eV", "0.4 eV"))}}
    rows = [{**gpqa, "Record ID": f"rec{i}", **(volts if i == 6 else {})} for i in range(8)]
    (tmp_path / "gpqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in math500_rows([g for g, _ in EQUIVALENT])))
    raw = yaml.safe_load((ROOT / "experiments" / "kl_free.yaml").read_text())
    raw.pop("axes"), raw.pop("baseline")
    raw["defaults"]["eval"]["benchmarks"] = {
        "gpqa": {"path": str(tmp_path / "gpqa.jsonl")},
        "math500": {**raw["defaults"]["eval"]["benchmarks"]["math500"], "path": str(tmp_path / "math500.jsonl")}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (cell,) = study_cells(load_study(tmp_path / "s.yaml"))
    math_answers = {p: recipe(a) for p, (_, a) in zip(range(len(EQUIVALENT)), EQUIVALENT)}

    class Policy:  # GPQA: the letter of "electron" in the tag, "(X) electron", a wrong letter, no tag but "answer is X",
        # then option text: "electron", a wrong option's, "2.5" for 2.50 eV, no option's
        def generate(self, prompts, protocol, seed=0):
            assert protocol.n == 1 and protocol.temperature == 0
            if "multiple choice" not in prompts[0]:
                assert all("\\boxed" not in p for p in prompts)   # the cell's template: one answer instruction
                return [[Completion(math_answers[i], 9, False)] for i in range(len(prompts))]
            # GPQA's one answer instruction: the letter, where the system prompt says (no \boxed{} request beside it)
            assert all("\\boxed" not in p and p.endswith("give the letter of your final answer (A, B, C, D).")
                       for p in prompts), prompts[0]
            out = []
            for i, p in enumerate(prompts):
                letter = next((line[0] for line in p.splitlines() if line.endswith(") electron")), None)
                other = "A" if letter != "A" else "B"
                text = [recipe(letter), recipe(f"({letter}) electron"), recipe(other),
                        f"<reasoning>\nso the answer is {letter}\n</reasoning>", recipe("electron"), recipe("photon"),
                        recipe("2.5"), recipe("positron")][i]
                out.append([Completion(text, 9, False)])
            return out

    monkeypatch.setattr(ev, "make_backend", lambda *a, **k: Policy())
    monkeypatch.setattr(ev, "weights_for", lambda *a, **k: ("unused", None))
    monkeypatch.setattr(ev, "log_to_mlflow", lambda *a, **k: None)
    got = ev.evaluate_cell("kl_free", cell, tmp_path / "res", is_base=True)
    assert got == {"gpqa": {"pass@1": 5 / 8}, "math500": {"pass@1": 1.0}}
    out = tmp_path / "res" / "kl_free" / cell.id / "eval"
    assert json.loads((out / "gpqa.json").read_text())["grading"]["answer_format"] == "xml_answer"
    assert json.loads((out / "math500.json").read_text())["grading"]["answer_format"] == "xml_math"
    stored = [json.loads(line) for line in (out / "gpqa.jsonl").read_text().splitlines()]
    letter = [("ABCD"[s["choices"].index(t)] if t else None) for s, t in zip(stored[4:], ("electron", "photon", "2.50 eV", None))]
    assert [s["extracted"] for s in stored[4:]] == letter and letter[2] == stored[6]["gold"]   # choices as the prompt listed them
    assert all("choices" not in json.loads(line) for line in (out / "math500.jsonl").read_text().splitlines())

    from lorarl.evaluate.main import rescore_file

    again = rescore_file(out / "gpqa.jsonl", write=False)
    assert again["identical"] and not again["verdicts_changed"] and "choices" not in capsys.readouterr().err
    (out / "gpqa.jsonl").write_text("".join(json.dumps({k: v for k, v in s.items() if k != "choices"}) + "\n"
                                            for s in stored))   # records from before the choices were kept
    old = rescore_file(out / "gpqa.jsonl", write=False)
    assert "8 sample(s) stored without their problem's choices" in capsys.readouterr().err
    assert [(f["problem_id"], f["extracted_after"]) for f in old["verdicts_changed"]] == [("rec4", None), ("rec6", None)]
    assert old["new"]["metrics"]["pass@1"]["value"] == 3 / 8       # letters only: the verdicts before this rule


def test_the_config_names_every_registered_format():
    from typing import get_args

    from lorarl.grading.overrides import AnswerFormat
    from lorarl.grading.answer_formats import ANSWER_FORMATS, MATH_VERIFIED, SPANS

    assert get_args(AnswerFormat) == ANSWER_FORMATS and set(MATH_VERIFIED) | set(SPANS) <= set(ANSWER_FORMATS)
    CellConfig(reward={"answer_format": "xml_math", "grading": {"float_rounding": 3}})   # math-verify settings apply


def test_other_formats_leave_the_letter_grader_alone():
    """Only a span format reaches the letter grader: other studies' GPQA grading (and so the evaluation's
    signature, which counts grading settings that are not the registry's) stays as it was."""
    plain = CellConfig(eval={"benchmarks": ["gpqa"]})
    for fmt in ("answer_line", "last_number"):
        cfg = CellConfig(reward={"answer_format": fmt}, eval={"benchmarks": ["gpqa"]})
        assert cell_grading(cfg, "gpqa") == cell_grading(plain, "gpqa") == get_benchmark("gpqa").grading
    xml = CellConfig(reward={"answer_format": "xml_answer"}, eval={"benchmarks": ["gpqa"]})
    assert cell_grading(xml, "gpqa").answer_format == "xml_answer"


def test_a_letter_graders_span_format_is_recorded_for_rescoring(cfg):
    s = Sample("p", 0, "q", "D", recipe("D"), "D", True, False, False, 9)
    kw = dict(benchmark="gpqa", grader="choice")
    recorded = summarize_samples([s], Protocol.greedy(16), grading=cell_grading(cfg, "gpqa"), **kw)["grading"]
    assert recorded["answer_format"] == "xml_answer"
    assert summarize_samples([s], Protocol.greedy(16), **kw)["grading"] is None
