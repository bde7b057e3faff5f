"""Paper 002's prompt: one answer instruction (reason inside <think> </think>, then the answer in
\\boxed{}), put to the BARE problem in training and evaluation alike. DAPO-Math-17k-Processed's `prompt`
column carries DAPO's own "Answer:" instruction: `task.unwrap: dapo` takes the problem out of it. The row is a
local fixture in the dataset's schema (tests/data/dapo_math_17k_processed.jsonl); nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorarl.language.config import CellConfig
from lorarl.tasks.prompt import THINK_INSTRUCTION, prompt_ids

ROW = Path(__file__).parents[1] / "data" / "dapo_math_17k_processed.jsonl"
INSTRUCTIONS = ("\\boxed{}", "Answer:", "<think>")  # each answer instruction names one of these


def _cfg(model: str, bench: Path, **task) -> CellConfig:
    return CellConfig.model_validate({
        "model": model, "prompt": {"think": True},  # peft_zoo's prompt section
        "task": {"name": "dataset", "path": str(ROW), "answer_field": "solution", **task},
        "eval": {"benchmarks": {"math500": {"path": str(bench)}}}})


def test_training_row_and_benchmark_problem_carry_the_same_one_instruction(tiny_dirs, tmp_path):
    from lorarl.evaluate.main import load_problems
    from lorarl.models import load_model_and_tokenizer
    from lorarl.tasks.trainset import training_dataset

    row = json.loads(ROW.read_text())
    assert {"prompt", "solution", "source_prompt", "reward_model", "extra_info"} <= set(row)
    assert "Answer:" in row["prompt"]  # the dataset's own instruction is there to be taken out
    bench = tmp_path / "math500.jsonl"
    bench.write_text(json.dumps({"problem": "Find $x$ if $2x = 10$.", "answer": "5", "unique_id": "u0"}) + "\n")
    _, tok = load_model_and_tokenizer(tiny_dirs["plain"])
    cfg = _cfg(tiny_dirs["plain"], bench, unwrap="dapo")
    ds, _ = training_dataset(cfg, tok)
    train_text = tok.decode(prompt_ids(tok, ds[0]["prompt"]))
    eval_text = load_problems("math500", cfg)[0].prompt
    for text, problem in ((train_text, "find $a + b + c$."), (eval_text, "Find $x$ if $2x = 10$.")):
        assert text.count(THINK_INSTRUCTION) == 1 and "Answer:" not in text
        assert text.count("\\boxed{}") == 1  # one answer instruction, no second boxed request
        head, tail = text.split(problem)
        assert tail == f"\n\n{THINK_INSTRUCTION}"  # the same instruction after the problem in both stages
    # without unwrap the row would carry DAPO's instruction and the think/boxed one: two answer formats
    ds2, _ = training_dataset(_cfg(tiny_dirs["plain"], bench), tok)
    both = tok.decode(prompt_ids(tok, ds2[0]["prompt"]))
    assert "Answer:" in both and THINK_INSTRUCTION in both


def test_unwrap_refuses_rows_without_the_wrapper_and_bad_combinations(tmp_path):
    from pydantic import ValidationError

    from lorarl.tasks import task_records

    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": "What is 3 + 3?", "solution": "6"}) + "\n")
    task = CellConfig.model_validate({"task": {"name": "dataset", "path": str(bare), "answer_field": "solution",
                                               "unwrap": "dapo"}}).task
    with pytest.raises(ValueError, match="task.unwrap dapo: row 0 is not the dapo wrapper's text"):
        task_records(task)
    with pytest.raises(ValidationError, match="set one of them"):
        CellConfig.model_validate({"task": {"name": "dataset", "path": "x", "unwrap": "dapo", "prompt_rendered": True}})
    with pytest.raises(ValidationError, match="Input should be 'dapo'"):
        CellConfig.model_validate({"task": {"name": "dataset", "path": "x", "unwrap": "alpaca"}})


def test_multiple_choice_with_think_asks_once_for_the_letter(tmp_path):
    """GPQA under ``prompt.think``: its registry instruction (the letter in \\boxed{}) becomes the think
    variant, not the letter instruction followed by the generic think/boxed one; without think, as before."""
    from lorarl.grading.benchmarks import CHOICE_TEMPLATE, get_benchmark
    from lorarl.evaluate.main import load_problems

    gpqa = get_benchmark("gpqa")
    path = tmp_path / "gpqa.jsonl"
    path.write_text(json.dumps(dict(gpqa.example)) + "\n")
    texts = {}
    for think in (True, False):
        cfg = CellConfig.model_validate({"prompt": {"think": think},
                                         "eval": {"benchmarks": {"gpqa": {"path": str(path)}}}})
        texts[think] = load_problems("gpqa", cfg)[0].prompt
    on, off = texts[True], texts[False]
    assert on.count("\\boxed{}") == 1 and on.count("<think>") == 1 and THINK_INSTRUCTION not in on
    assert on.rstrip().endswith("put the letter of your final answer (A, B, C, D) within \\boxed{}.")
    assert "Which particle has spin 1/2?" in on and "D) " in on  # the question and its choices are kept
    assert off.count("\\boxed{}") == 1 and "<think>" not in off
    assert off.endswith(CHOICE_TEMPLATE.split("{choices}")[1].format(letters="A, B, C, D"))


def test_multiple_choice_under_an_answer_span_asks_for_the_letter_alone(tmp_path):
    """GPQA in a study trained on ``<answer>`` (paper 000's xml_answer, and xml_math): its registry instruction (the
    letter in \\boxed{}) becomes the span variant, the letter without a \\boxed{} request; a boxed study keeps it."""
    from lorarl.grading.benchmarks import CHOICE_SPAN_TEMPLATE, get_benchmark
    from lorarl.evaluate.main import load_problems

    path = tmp_path / "gpqa.jsonl"
    path.write_text(json.dumps(dict(get_benchmark("gpqa").example)) + "\n")
    for fmt, boxed in (("xml_answer", False), ("xml_math", False), ("boxed", True), ("answer_line", True)):
        cfg = CellConfig.model_validate({"reward": {"answer_format": fmt},
                                         "eval": {"benchmarks": {"gpqa": {"path": str(path)}}}})
        text = load_problems("gpqa", cfg)[0].prompt
        assert ("\\boxed{}" in text) == boxed, fmt
        assert text.endswith(CHOICE_SPAN_TEMPLATE.split("{choices}")[1].format(letters="A, B, C, D")) != boxed, fmt
        assert "Which particle has spin 1/2?" in text and "D) " in text
