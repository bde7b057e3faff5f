"""Prompt settings of a cell (``prompt:``) and a base row's own prompt settings (``eval.base_prompts``).

Pure pydantic (no lorarl imports besides the number guard): :mod:`lorarl.language.config` imports both classes.

* :class:`PromptConfig`: how a problem becomes the model's input, identically in the train and
  evaluate stages (:mod:`lorarl.tasks.prompt`);
* :class:`BasePrompt`: the prompt settings one kind of base row is asked with instead of the
  study's (``eval.base_prompts.base``: the untrained student rows; ``eval.base_prompts.teacher``:
  the distillation teacher row of ``eval.teacher_benchmarks``).  Paper 001 Table 2 asks its teacher,
  Qwen3-8B, in its own chat format while the base-model student is asked in plain text.  The
  override is part of that base row's prompt, so of its evaluation signature: changing it reruns
  that base row's evaluations and nothing else (trained cells never read it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from lorarl.strict import Strict

CHAT_TEMPLATE = ("auto", "on", "off")
BASE_ROWS = ("base", "teacher")  # the keys of eval.base_prompts


def _on_off(v: Any) -> Any:  # YAML reads a bare `on`/`off` as true/false
    return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class PromptConfig(Strict):
    """How a problem becomes the model's input, identically in the train and evaluate stages
    (lorarl.tasks.prompt). A study sets it once; a base model is then told what the reward pays."""

    template: str | None = None  # user message with {question}; null = by source: synthetic "{question}", else math + \\boxed{} instruction
    system: str | None = None  # system prompt (a system message with the chat template, else text + blank line)
    chat_template: Literal["auto", "on", "off"] = "auto"  # wrap in the tokenizer's chat template (auto = if it has one)
    think: bool = False  # ask for reasoning inside <think>...</think> before the boxed answer (paper 002's format)
    thinking: bool | None = Field(None, json_schema_extra={"signature_omits_default": True})  # the chat template's thinking mode (enable_thinking, e.g. Qwen3's): true/false; null = the template's default; needs the chat template

    @field_validator("chat_template", mode="before")
    @classmethod
    def _yaml_bool(cls, v: Any) -> Any:
        return _on_off(v)

    @field_validator("template")
    @classmethod
    def _has_question(cls, v: str | None) -> str | None:
        if v is not None and "{question}" not in v:
            raise ValueError("prompt.template must contain the placeholder {question}")
        return v

    @model_validator(mode="after")
    def _thinking_needs_chat(self) -> "PromptConfig":
        if self.thinking is not None and self.chat_template == "off":
            raise ValueError(f"prompt.thinking {str(self.thinking).lower()} is the chat template's thinking mode, but "
                             "prompt.chat_template is 'off'; allowed: chat_template auto or on with thinking "
                             "true/false, or thinking null")
        return self


class BasePrompt(Strict):
    """A base row's own prompt settings (``eval.base_prompts.<base|teacher>``); null = the study's."""

    chat_template: Literal["auto", "on", "off"] | None = None  # the chat template for this row (auto, on, off)
    thinking: bool | None = None  # the chat template's thinking mode (enable_thinking) for this row: true/false

    @field_validator("chat_template", mode="before")
    @classmethod
    def _yaml_bool(cls, v: Any) -> Any:
        return _on_off(v)

    def apply(self, prompt: PromptConfig, row: str = "base") -> PromptConfig:
        """``prompt`` with this row's settings in place of the study's (checked together: an error
        names ``eval.base_prompts.<row>``)."""
        changes = self.model_dump(exclude_none=True)
        if not changes:
            return prompt
        try:
            return PromptConfig.model_validate({**prompt.model_dump(), **changes})
        except ValidationError as err:
            why = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
            raise ValueError(f"eval.base_prompts.{row}: {why}") from None


def check_base_prompts(value: Any) -> Any:
    """``eval.base_prompts`` keys: an unknown row is an error naming the allowed ones."""
    unknown = sorted(str(k) for k in (value or {}) if k not in BASE_ROWS)
    if unknown:
        raise ValueError(f"eval.base_prompts: unknown base row(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(BASE_ROWS)} (the untrained student rows, the distillation teacher row)")
    return value

