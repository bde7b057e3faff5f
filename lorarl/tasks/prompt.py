"""The one prompt of a cell: how a problem's question becomes the model's input token ids, the same way
in the train stage (TRL's GRPOTrainer) and the evaluate stage (lorarl.evaluate backends).

A cell's ``prompt:`` section (:class:`lorarl.language.config.PromptConfig`) gives

* ``template``: the user message, with ``{question}``, for every question source (null = by source:
  ``"{question}"`` for synthetic questions, which already are the tiny models' SFT format
  ``Q: 2+3=?\\nA: ``; :data:`MATH_TEMPLATE` with the ``\\boxed{}`` instruction for any other task
  or benchmark, the instruction evaluation always used);
* ``think``: the ``<think>`` instruction (paper 002's format) appended to the user message;
* ``system``: a system prompt;
* ``chat_template``: ``on`` / ``off`` / ``auto`` (auto = on when the tokenizer has a chat template);
* ``thinking``: the chat template's thinking mode (``enable_thinking``, Qwen3's); null = the template's default.

With the chat template, the input is a conversation (a list of messages): TRL tokenises it with
``apply_chat_template(add_generation_prompt=True)`` and so does :func:`prompt_ids`. Without it the
input is the plain text, tokenised as TRL tokenises a string prompt (``tokenizer(text)``, special
tokens added as the tokenizer's defaults say). :func:`prompt_ids` is what the evaluate backends feed
to ``generate``, so both stages see byte-identical ids (tests/tasks/test_prompt.py checks it against TRL).
"""

from __future__ import annotations

from typing import Any, Sequence


def template_kwargs(prompt: Any) -> dict[str, Any]:
    """Keyword arguments of ``apply_chat_template`` a prompt config adds (TRL's ``chat_template_kwargs``)."""
    thinking = getattr(prompt, "thinking", None) if prompt is not None else None
    return {} if thinking is None else {"enable_thinking": bool(thinking)}


MATH_TEMPLATE = ("{question}\n\nPlease reason step by step, and put your final answer within "
                 "\\boxed{}.")  # the text of the evaluation registry's math template (lorarl.grading.benchmarks)
THINK_INSTRUCTION = ("First think through the problem inside <think> </think> tags, then give the final "
                     "answer within \\boxed{}.")  # paper 002 asks for <think>...</think> then \boxed{}

DAPO_TEMPLATE = ("Solve the following math problem step by step. The last line of your response should be of the "
                 "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{question}\n\n"
                 "Remember to put your answer on its own line after \"Answer:\".")  # DAPO-Math-17k's user message (papers 002/003); graded by reward.answer_format answer_line
WRAPPERS = {"dapo": DAPO_TEMPLATE}  # task.unwrap: a dataset's instructed message, the bare problem at {question}
Prompt = "str | list[dict[str, str]]"  # plain text, or a conversation for the chat template


def default_template(synthetic: bool, think: bool = False) -> str:
    """The template of a null ``prompt.template``: a synthetic question already is the whole prompt
    the tiny models were SFT'd on; any other question gets the math instruction, unless ``prompt.think``
    adds its own (``<think>`` then ``\\boxed{}``): one answer instruction, not two."""
    return "{question}" if synthetic or think else MATH_TEMPLATE


def template_of(cfg: Any, synthetic: bool | None = None) -> str:
    """The resolved user-message template of a cell config for a question source (default: the
    cell's training task; evaluation passes whether the benchmark is the synthetic one)."""
    if cfg.prompt.template is not None:
        return cfg.prompt.template
    return default_template(cfg.task.name == "synthetic" if synthetic is None else synthetic, cfg.prompt.think)


def unwrap(wrapper: str, texts: Sequence[str]) -> list[str]:
    """The bare problems inside a dataset's instructed messages (``task.unwrap``: :data:`WRAPPERS`); a row
    without the wrapper is an error naming it."""
    pre, post = WRAPPERS[wrapper].split("{question}")
    out = []
    for i, t in enumerate(texts):
        if not (t.startswith(pre) and t.endswith(post) and len(t) > len(pre) + len(post)):
            raise ValueError(f"task.unwrap {wrapper}: row {i} is not the {wrapper} wrapper's text (it must begin "
                             f"{pre[:50]!r} and end {post[-50:]!r}); got {t[:80]!r}... Set task.unwrap: null if the "
                             "column holds bare problems")
        out.append(t[len(pre):len(t) - len(post)])
    return out


def user_message(cfg: Any, question: str, *, rendered: bool = False, synthetic: bool | None = None,
                 add_think: bool | None = None) -> str:
    """The user message of ``question``: the cell's template with ``{question}`` replaced (plain text
    replacement: other braces, e.g. ``\\boxed{}``, are literal), plus the think instruction.
    ``rendered=True``: ``question`` already is a whole message (a multiple-choice benchmark's own
    template, which needs its choices); only the think instruction is added. ``synthetic``: see
    :func:`template_of`. ``add_think``: append the think instruction (None = ``prompt.think``; False
    when the rendered message already carries its own, e.g. the multiple-choice think template)."""
    text = question if rendered else template_of(cfg, synthetic).replace("{question}", question)
    if cfg.prompt.think if add_think is None else add_think:
        text = f"{text}\n\n{THINK_INSTRUCTION}"
    return text


def uses_chat_template(setting: str, tokenizer: Any | None) -> bool:
    """Resolve ``prompt.chat_template`` for a tokenizer (``auto``: does it have one?)."""
    has = bool(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else False
    if setting == "on":
        if tokenizer is not None and not has:
            raise ValueError("prompt.chat_template is 'on' but the tokenizer has no chat template; "
                             "allowed: auto, on, off")
        return True
    if setting == "off":
        return False
    if setting != "auto":
        raise ValueError(f"prompt.chat_template {setting!r}; allowed: auto, on, off")
    return has


def build_prompt(pc: Any, user: str, tokenizer: Any) -> "Prompt":
    """What TRL's dataset ``prompt`` column holds (and evaluation tokenises): messages or text.
    ``pc``: the cell's PromptConfig."""
    system = pc.system
    if uses_chat_template(pc.chat_template, tokenizer):
        msgs = [{"role": "system", "content": system}] if system else []
        return msgs + [{"role": "user", "content": user}]
    if getattr(pc, "thinking", None) is not None:
        raise ValueError(f"prompt.thinking {str(pc.thinking).lower()} is the chat template's thinking mode, but "
                         "this tokenizer has no chat template (prompt.chat_template auto); allowed: thinking null, "
                         "or a model whose tokenizer has a chat template")
    return f"{system}\n\n{user}" if system else user


def prompt_ids(tokenizer: Any, prompt: "Prompt", pc: Any = None) -> list[int]:
    """Token ids of one prompt exactly as TRL 1.16's ``GRPOTrainer._tokenize_prompts`` makes them
    (``pc``: the cell's PromptConfig, whose ``thinking`` is TRL's ``chat_template_kwargs``)."""
    if isinstance(prompt, list):
        out = tokenizer.apply_chat_template(conversation=[prompt], add_generation_prompt=True, tokenize=True,
                                            return_dict=True, **template_kwargs(pc))
        return [int(t) for t in out["input_ids"][0]]
    return [int(t) for t in tokenizer(text=[prompt])["input_ids"][0]]


def prompt_text(tokenizer: Any, prompt: "Prompt", pc: Any = None) -> str:
    """A readable form of the prompt (what is stored with evaluation samples)."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **template_kwargs(pc))
    return prompt


def training_prompts(cfg: Any, questions: Sequence[str], tokenizer: Any) -> list["Prompt"]:
    """The training prompts of the dataset's questions; with ``task.prompt_rendered`` the questions
    already are the template's text (DAPO-Math's instructed prompts): checked, not wrapped again, so
    the evaluate stage, which wraps a benchmark's bare problem in the same template, asks alike."""
    rendered = bool(getattr(cfg.task, "prompt_rendered", False))
    if rendered:
        check_rendered(cfg, questions)
    return [build_prompt(cfg.prompt, user_message(cfg, q, rendered=rendered), tokenizer) for q in questions]


def check_rendered(cfg: Any, questions: Sequence[str]) -> None:
    """Every question must be the resolved template with one problem in place of ``{question}``."""
    tpl = template_of(cfg)
    if tpl.count("{question}") != 1:
        raise ValueError("task.prompt_rendered needs a prompt.template with exactly one {question}")
    pre, post = tpl.split("{question}")
    for i, q in enumerate(questions):
        if not (q.startswith(pre) and q.endswith(post) and len(q) > len(pre) + len(post)):
            raise ValueError(f"task.prompt_rendered: training prompt {i} is not prompt.template's text (it must "
                             f"begin {pre[:50]!r} and end {post[-50:]!r}); got {q[:80]!r}... Set "
                             "task.prompt_rendered: false (the template wraps the field) or fix prompt.template")


def within_length(cfg: Any, prompts: Sequence["Prompt"], tokenizer: Any) -> list[bool]:
    """Which prompts fit ``train.max_prompt_length`` tokens (all when it is null, or when longer prompts
    are cut to their last tokens instead: ``train.prompt_overflow: truncate_left``)."""
    limit = cfg.train.max_prompt_length
    if limit is None or getattr(cfg.train, "prompt_overflow", "drop") == "truncate_left":
        return [True] * len(prompts)
    return [len(prompt_ids(tokenizer, p, cfg.prompt)) <= limit for p in prompts]


def prompt_keep(train: Any) -> int | None:
    """How many prompt tokens a rollout keeps: ``max_prompt_length`` under truncate_left, else all
    (the cut itself: lorarl.train.prompt_fit)."""
    return train.max_prompt_length if getattr(train, "prompt_overflow", "drop") == "truncate_left" else None

