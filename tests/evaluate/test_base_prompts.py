"""A base row's own prompt settings (eval.base_prompts, lorarl.language.prompt) and paper 001 Table 2.

Paper 001 asks its distillation teacher, Qwen3-8B, in its chat format (Table 2: pass@1 0.640, 3,211
mean tokens at a 4,096 cap) while the base-model student is asked in plain text. A base row's override
(chat template, thinking on/off) reaches the prompt ids its evaluation generates from, is part of that
row's evaluation signature only, and the report assembles Table 2 from the student and teacher rows.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from pydantic import ValidationError

from lorarl import paths
from lorarl.language.config import CellConfig
from lorarl.language.study import base_cells, cell_table, load_study, study_cells

# A Qwen3-like chat template: with enable_thinking false the generation prompt carries an empty think
# block (Qwen3's "thinking off"); with it true an open one; undefined (the template's default): neither.
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined %}"
        "{% if enable_thinking %}<think>{% else %}<think></think>{% endif %}{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    """A tiny model whose tokenizer has the Qwen3-like chat template (the teacher of the studies below)."""
    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "<|user|><|assistant|><think></think>"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    tok.chat_template = CHAT
    d = tmp_path_factory.mktemp("chat")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def _study(tmp_path, teacher: str, base_prompts: dict | None, name: str = "bp"):
    ev = {"benchmarks": ["synthetic"], "teacher_benchmarks": ["synthetic"],
          **({"base_prompts": base_prompts} if base_prompts is not None else {})}
    raw = {"name": name, "defaults": {"train": {"steps": 2}, "prompt": {"chat_template": "off"},
                                      "reward": {"teacher": teacher}, "eval": ev},
           "axes": {"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 8]}}}
    p = tmp_path / f"{name}-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_study(p)


def _rows(study):
    bases = {b.id: b for b in base_cells(study)}
    teacher = next(b for k, b in bases.items() if k.startswith("teacher-"))
    return bases["base"], teacher


@pytest.mark.parametrize("thinking,marker", [(True, "<think>"), (False, "<think></think>"), (None, "")])
def test_teacher_override_reaches_the_rendered_prompt(tmp_path, chat_model, thinking, marker):
    from lorarl.evaluate.backends import HFBackend
    from lorarl.evaluate.main import load_problems
    from lorarl.tasks.prompt import build_prompt, prompt_text
    from transformers import AutoTokenizer

    over = {"chat_template": "on", **({"thinking": thinking} if thinking is not None else {})}
    student, teacher = _rows(_study(tmp_path, chat_model, {"teacher": over}))
    assert student.config.prompt.chat_template == "off" and student.config.prompt.thinking is None
    assert teacher.config.prompt.chat_template == "on" and teacher.config.prompt.thinking is thinking
    user = load_problems("synthetic", teacher.config)[0].prompt
    tok = AutoTokenizer.from_pretrained(chat_model)
    text = prompt_text(tok, build_prompt(teacher.config.prompt, user, tok), teacher.config.prompt)
    assert text == f"<|user|>{user}<|endoftext|><|assistant|>{marker}"
    # the evaluate stage's backend generates from exactly these ids
    ids = HFBackend(chat_model, prompt_config=teacher.config.prompt).encode([user])[0]
    assert ids == list(tok(text, add_special_tokens=False)["input_ids"])
    # the student row (the study's prompt: plain text) is asked as before, on the same tokenizer
    plain = HFBackend(chat_model, prompt_config=student.config.prompt).encode([user])[0]
    assert plain == list(tok(user)["input_ids"])


def test_base_override_applies_to_the_student_rows_only(tmp_path, chat_model):
    student, teacher = _rows(_study(tmp_path, chat_model, {"base": {"chat_template": "on", "thinking": False}}))
    assert (student.config.prompt.chat_template, student.config.prompt.thinking) == ("on", False)
    assert (teacher.config.prompt.chat_template, teacher.config.prompt.thinking) == ("off", None)
    for c in study_cells(_study(tmp_path, chat_model, {"base": {"chat_template": "on"}})):  # trained cells: the study's
        assert c.config.prompt.chat_template == "off"


def test_override_changes_only_that_base_rows_signature(tmp_path, chat_model):
    def sigs(base_prompts):
        t = cell_table(_study(tmp_path, chat_model, base_prompts))
        return ({c.id: (c.hash, t.eval_signature(c.id, "synthetic")) for c in t.cells},
                {b.id: t.eval_signature(b.id, "synthetic") for b in t.bases})

    cells0, bases0 = sigs(None)
    cells1, bases1 = sigs({"teacher": {"chat_template": "on", "thinking": True}})
    cells2, bases2 = sigs({"teacher": {"chat_template": "on", "thinking": False}})
    cells3, bases3 = sigs({"base": {"chat_template": "on"}})
    teacher = next(k for k in bases0 if k.startswith("teacher-"))
    assert cells0 == cells1 == cells2 == cells3               # no trained cell is retrained or re-evaluated
    assert bases0["base"] == bases1["base"] == bases2["base"]  # the student row keeps its evaluations
    assert len({bases0[teacher], bases1[teacher], bases2[teacher]}) == 3  # thinking on/off: its own runs
    assert bases3["base"] != bases0["base"] and bases3[teacher] == bases0[teacher]
    assert sigs({}) == (cells0, bases0)                       # an empty override is no override


def test_thinking_on_a_study_prompt_reaches_training_and_evaluation(tmp_path, chat_model):
    """`prompt.thinking` is a prompt setting like the others: TRL's chat_template_kwargs in training."""
    from lorarl.train.trl_args import grpo_args

    on = CellConfig(model=chat_model, prompt={"chat_template": "on", "thinking": False})
    assert grpo_args(on, tmp_path / "a", use_cpu=True).chat_template_kwargs == {"enable_thinking": False}
    assert not grpo_args(CellConfig(), tmp_path / "b", use_cpu=True).chat_template_kwargs


@pytest.mark.parametrize("raw,msg", [
    ({"eval": {"base_prompts": {"student": {"thinking": True}}}},
     "eval.base_prompts: unknown base row(s) student; allowed: base, teacher"),
    ({"eval": {"base_prompts": {"teacher": {"chat_template": "always"}}}}, "chat_template"),
    ({"eval": {"base_prompts": {"teacher": {"think_mode": True}}}}, "think_mode"),
    ({"prompt": {"chat_template": "off", "thinking": True}},
     "prompt.thinking true is the chat template's thinking mode, but prompt.chat_template is 'off'; allowed"),
])
def test_bad_settings_name_the_field_and_the_allowed_values(raw, msg):
    with pytest.raises(ValidationError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        CellConfig.model_validate(raw)


def test_teacher_thinking_without_its_chat_template_is_an_error(tmp_path, chat_model):
    with pytest.raises(ValueError, match=r"eval.base_prompts.teacher: .*prompt.chat_template is 'off'"):
        base_cells(_study(tmp_path, chat_model, {"teacher": {"thinking": True}}))


def test_thinking_needs_a_tokenizer_with_a_chat_template():
    from lorarl.models import build_tokenizer
    from lorarl.tasks.prompt import build_prompt

    tok = build_tokenizer(["Q: 1+1=?\nA: 2"] * 5, vocab_size=60)
    with pytest.raises(ValueError, match="prompt.thinking true .* no chat template"):
        build_prompt(CellConfig(prompt={"thinking": True}).prompt, "hi", tok)


# ----------------------------------------------------------------------------- Table 2
def _summary(path, metrics: dict[str, float], mean_tokens: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metrics": {k: {"value": v, "ci_low": v - 0.05, "ci_high": v + 0.05}
                                            for k, v in metrics.items()},
                                "n_problems": 500, "mean_tokens": mean_tokens}))


def test_table_2_assembles_student_and_teacher_rows(tmp_path, chat_model):
    from lorarl.report.data import load
    from lorarl.report.envelope import DELTA, capability_table

    study = _study(tmp_path, chat_model, {"teacher": {"chat_template": "on", "thinking": True}})
    res = tmp_path / "results"
    student, teacher = _rows(study)
    for row, vals, length in ((student, (0.299, 0.535, 0.642), 791.0), (teacher, (0.640, 0.729, 0.760), 3211.0)):
        _summary(paths.path("eval_summary", results=res, study=study.name, cell=row.id, benchmark="synthetic"),
                 {"avg@8": vals[0], "pass@1": vals[0], "pass@4": vals[1], "pass@8": vals[2]}, length)
    t = capability_table(load(study, res)).set_index("metric")
    s_col, t_col = [c for c in t.columns if c not in ("benchmark", DELTA)]
    assert "student" in s_col and "tiny-arith" in s_col and "teacher" in t_col and chat_model in t_col
    assert list(t.index) == ["pass@1", "pass@4", "pass@8", "exploration gap (pass@4 − pass@1)",
                             "mean response length (tokens)"]
    assert (t["benchmark"] == "synthetic").all()
    assert t.loc["pass@1", s_col] == pytest.approx(0.299) and t.loc["pass@8", t_col] == pytest.approx(0.760)
    assert t.loc["exploration gap (pass@4 − pass@1)", s_col] == pytest.approx(0.236)
    assert t.loc["exploration gap (pass@4 − pass@1)", DELTA] == pytest.approx(0.089 - 0.236)
    assert t.loc["mean response length (tokens)", DELTA] == pytest.approx(2420.0)
    assert t.loc["pass@1", DELTA] == pytest.approx(0.341)


def test_table_2_needs_a_teacher_row(tmp_path):
    from lorarl.report.data import load
    from lorarl.report.envelope import capability_table

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "noteacher", "defaults": {"train": {"steps": 2}},
                                 "axes": {"rank": {"field": "adapter.rank", "values": [1]}}}))
    study = load_study(p)
    _summary(paths.path("eval_summary", results=tmp_path / "r", study="noteacher", cell="base", benchmark="synthetic"),
             {"pass@1": 0.5}, 10.0)
    assert capability_table(load(study, tmp_path / "r")).empty
