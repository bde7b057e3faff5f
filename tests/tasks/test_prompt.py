"""One prompt for training and evaluation (lorarl.tasks.prompt, the cell's `prompt:` section).

The gate: for the same problem, the ids TRL's GRPOTrainer tokenises in the train stage (from the
dataset `tasks.trainset.training_dataset` builds) equal, byte for byte, the ids the evaluate stage's HF backend
feeds to `generate` (from `evaluation.load_problems`), with and without the chat template, system
prompt and think format.
"""

from __future__ import annotations

import json

import pytest

from lorarl.language.config import CellConfig
from lorarl.tasks.prompt import MATH_TEMPLATE, THINK_INSTRUCTION, prompt_ids, user_message

GSM = [{"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in (3, 14)]


def _trainer(model, tok, dataset, tmp_path):
    from trl import GRPOConfig

    from lorarl.train.trainer import LorarlGRPOTrainer
    from lorarl.rewards.outcome import OutcomeDeposits

    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to="none", use_cpu=True, save_strategy="no")
    return LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=lambda c, a: [0.0] * len(c)), args=args,
                             train_dataset=dataset, processing_class=tok)


@pytest.mark.parametrize("kind,prompt", [
    ("synthetic", {}),  # the demo: the tiny model's own SFT format, no chat template
    ("dataset", {}),  # a real dataset: the math instruction, chat template auto (absent) -> plain
    ("dataset", {"chat_template": "on", "system": "You are a careful solver.", "think": True}),
    ("dataset", {"template": "Solve: {question}\nEnd with \\boxed{}.", "chat_template": "off", "system": "S"}),
])
def test_train_and_eval_stages_build_identical_prompt_ids(tiny_dirs, tmp_path, kind, prompt):
    from lorarl.evaluate.backends import HFBackend
    from lorarl.evaluate.main import load_problems
    from lorarl.tasks import task_records
    from lorarl.tasks.trainset import training_dataset

    model_dir = tiny_dirs["chat" if prompt.get("chat_template") == "on" else "plain"]
    if kind == "synthetic":  # the train split's rows, given to the synthetic benchmark as a local file
        task = {"name": "synthetic", "n_train": 3, "n_eval": 2}
        rows = task_records(CellConfig(task=task).task)[0]
        bench = "synthetic"
    else:  # the same GSM8K-schema file is the training task and the evaluation benchmark
        task = {"name": "dataset", "path": str(tmp_path / "d.jsonl"), "prompt_field": "question"}
        rows, bench = GSM, "gsm8k"
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = CellConfig.model_validate({"model": model_dir, "task": task, "prompt": prompt,
                                     "eval": {"benchmarks": {bench: {"path": str(tmp_path / "d.jsonl")}}}})
    from lorarl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(model_dir)
    ds, facts = training_dataset(cfg, tok)  # what train_cell hands to the trainer
    trainer = _trainer(model, tok, ds, tmp_path)
    assert facts["prompt_chat_template"] is (prompt.get("chat_template") == "on")
    problems = load_problems(bench, cfg)
    backend = HFBackend(model_dir, prompt_config=cfg.prompt)
    eval_ids = backend.encode([p.prompt for p in problems])
    train_ids = [list(map(int, trainer._tokenize_prompts([row["prompt"]])[0][0])) for row in ds]
    assert len(train_ids) == len(eval_ids) == len(rows)
    assert train_ids == eval_ids
    text = tok.decode(train_ids[0])
    if kind == "synthetic":
        assert text == rows[0]["prompt"]  # exactly the SFT format "Q: a+b=?\nA: ": the demo still learns
    else:
        assert GSM[0]["question"] in text and "\\boxed{}" in text
        assert (THINK_INSTRUCTION in text) is bool(prompt.get("think"))
        assert ("You are a careful solver." in text) is ("system" in prompt and prompt["system"] != "S")
        if prompt.get("chat_template") == "on":
            assert text.startswith("<|system|>") and text.endswith("<|assistant|>")


def test_default_template_resolves_by_source_and_is_plain_text():
    cfg = CellConfig()
    assert user_message(cfg, "Q: 1+2=?\nA: ") == "Q: 1+2=?\nA: "  # synthetic questions are whole prompts
    assert user_message(cfg, "What?", synthetic=False) == MATH_TEMPLATE.replace("{question}", "What?")
    assert MATH_TEMPLATE.endswith("within \\boxed{}.")  # literal braces, the registry's rendered text
    cfg = CellConfig(prompt={"template": "{question} -> \\boxed{}", "think": True})
    assert user_message(cfg, "Q") == f"Q -> \\boxed{{}}\n\n{THINK_INSTRUCTION}"


def test_prompt_config_errors_name_the_field_and_values(tiny_dirs):
    from pydantic import ValidationError

    from lorarl.models import load_model_and_tokenizer
    from lorarl.tasks.prompt import build_prompt

    with pytest.raises(ValidationError, match=r"\{question\}"):
        CellConfig(prompt={"template": "no placeholder"})
    with pytest.raises(ValidationError, match="chat_template"):
        CellConfig(prompt={"chat_template": "yes"})
    import yaml  # a bare `on` / `off` in a study YAML is a boolean to YAML: read as meant

    assert CellConfig(prompt=yaml.safe_load("chat_template: on")).prompt.chat_template == "on"
    assert CellConfig(prompt=yaml.safe_load("chat_template: off")).prompt.chat_template == "off"
    _, tok = load_model_and_tokenizer(tiny_dirs["plain"])
    with pytest.raises(ValueError, match="prompt.chat_template is 'on'.*allowed: auto, on, off"):
        build_prompt(CellConfig(prompt={"chat_template": "on"}).prompt, "hi", tok)
    assert prompt_ids(tok, "Q: 1+2=?\nA: ") == tok("Q: 1+2=?\nA: ")["input_ids"]


def test_old_eval_chat_template_moves_to_the_prompt_section():
    assert CellConfig.model_validate({"eval": {"chat_template": True}}).prompt.chat_template == "on"
    assert CellConfig.model_validate({"eval": {"chat_template": False}}).prompt.chat_template == "off"
    assert CellConfig.model_validate({"eval": {"chat_template": None}}) == CellConfig()
    with pytest.raises(ValueError, match="contradicts prompt.chat_template"):
        CellConfig.model_validate({"eval": {"chat_template": True}, "prompt": {"chat_template": "off"}})


def test_prompt_is_in_the_train_and_eval_signatures():
    from lorarl.language.evalplan import plan

    a, b = CellConfig(), CellConfig(prompt={"system": "x"})
    assert plan.train_signature(a) != plan.train_signature(b)
    assert plan.eval_signature(a, "synthetic", is_base=True) != plan.eval_signature(b, "synthetic", is_base=True)


def test_max_prompt_length_drops_long_training_prompts(tiny_dirs):
    from lorarl.models import load_model_and_tokenizer
    from lorarl.tasks.trainset import training_dataset

    _, tok = load_model_and_tokenizer(tiny_dirs["plain"])
    cfg = CellConfig(task={"n_train": 50, "n_eval": 2, "min_operands": 2, "max_operands": 3})
    lengths = [len(prompt_ids(tok, r["prompt"])) for r in training_dataset(cfg, tok)[0]]
    limit = sorted(lengths)[len(lengths) // 2]
    ds, facts = training_dataset(cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"max_prompt_length": limit})}), tok)
    assert facts["prompts_dropped_too_long"] == sum(n > limit for n in lengths) > 0
    assert all(len(prompt_ids(tok, r["prompt"])) <= limit for r in ds)
    too_short = cfg.train.model_copy(update={"max_prompt_length": 1})
    with pytest.raises(ValueError, match="max_prompt_length=1"):
        training_dataset(cfg.model_copy(update={"train": too_short}), tok)


def test_dapo_instructed_dataset_and_bare_benchmark_ask_alike(tiny_dirs, tmp_path):
    """Paper 003: DAPO-Math's prompt column already holds DAPO's instruction; a benchmark holds the
    bare problem. With `task.prompt_rendered` and the DAPO template both stages feed the same ids."""
    from pydantic import ValidationError

    from lorarl.evaluate.backends import HFBackend
    from lorarl.evaluate.main import load_problems
    from lorarl.models import load_model_and_tokenizer
    from lorarl.tasks.prompt import DAPO_TEMPLATE
    from lorarl.tasks.trainset import training_dataset

    problems = ["What is 3 + 3?", "Find $x$ if $2x = 10$."]
    train, bench = tmp_path / "dapo.jsonl", tmp_path / "m.jsonl"
    train.write_text("".join(json.dumps({"prompt": DAPO_TEMPLATE.replace("{question}", q), "solution": "6"}) + "\n"
                             for q in problems))
    bench.write_text("".join(json.dumps({"problem": q, "answer": "6", "unique_id": f"u{i}"}) + "\n"
                             for i, q in enumerate(problems)))

    def cfg(rendered: bool) -> CellConfig:
        return CellConfig.model_validate({
            "model": tiny_dirs["chat"], "prompt": {"template": DAPO_TEMPLATE, "chat_template": "on"},
            "task": {"name": "dataset", "path": str(train), "answer_field": "solution", "prompt_rendered": rendered},
            "reward": {"answer_format": "answer_line"}, "eval": {"benchmarks": {"math500": {"path": str(bench)}}}})

    _, tok = load_model_and_tokenizer(tiny_dirs["chat"])
    eval_ids = HFBackend(tiny_dirs["chat"], prompt_config=cfg(True).prompt).encode(
        [p.prompt for p in load_problems("math500", cfg(True))])
    ds, _ = training_dataset(cfg(True), tok)
    train_ids = [prompt_ids(tok, row["prompt"]) for row in ds]
    assert train_ids == eval_ids
    assert tok.decode(train_ids[0]).count("Solve the following math problem") == 1
    doubled, _ = training_dataset(cfg(False), tok)  # without the flag the instruction is wrapped twice
    assert tok.decode(prompt_ids(tok, doubled[0]["prompt"])).count("Solve the following math problem") == 2
    train.write_text(json.dumps({"prompt": "What is 3 + 3?", "solution": "6"}) + "\n")
    with pytest.raises(ValueError, match="task.prompt_rendered: training prompt 0 is not prompt.template's text"):
        training_dataset(cfg(True), tok)
    with pytest.raises(ValidationError, match="task.prompt_rendered applies to task.name 'dataset' only"):
        CellConfig(task={"prompt_rendered": True})


def test_task_config_picks_the_hub_configuration(tmp_path):
    """``task.config`` reaches ``load_dataset``: a local dataset folder with two configurations (the
    layout of open-r1/DAPO-Math-17k-Processed: all / en) yields the named one's rows."""
    from pydantic import ValidationError

    from lorarl.tasks import task_records

    root = tmp_path / "dapo"
    for name, rows in {"all": [("1+1", "2"), ("2+2", "4"), ("3+3", "6")], "en": [("1+1", "2")]}.items():
        (root / name).mkdir(parents=True)
        (root / name / "train.jsonl").write_text(
            "".join(json.dumps({"prompt": q, "solution": a}) + "\n" for q, a in rows))
    (root / "README.md").write_text("---\nconfigs:\n- config_name: all\n  data_files:\n  - split: train\n"
                                    "    path: all/train.jsonl\n- config_name: en\n  data_files:\n"
                                    "  - split: train\n    path: en/train.jsonl\n---\n")
    base = {"name": "dataset", "path": str(root), "answer_field": "solution"}
    got = {c: task_records(CellConfig(task={**base, "config": c}).task)[0] for c in ("all", "en")}
    assert [r["prompt"] for r in got["all"]] == ["1+1", "2+2", "3+3"] and [r["answer"] for r in got["en"]] == ["2"]
    with pytest.raises(ValidationError, match="task.config"):
        CellConfig(task={"name": "dataset", "path": str(tmp_path / "d.jsonl"), "config": "all"})
