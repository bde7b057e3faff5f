"""A cell's ``reward:`` section: the fields every regime reads (:class:`RewardSection`), the base of each
regime's own section (its ``RegimeSpec.section``: the outcome grade's settings, the process PRM's, the
distillation teacher's). :func:`lorarl.rewards.registry.reward_section` validates a study's ``reward:`` block
with the section its ``regime`` names, so a field of another regime is an error naming the regime and its fields.

Signatures: before the sections, ``reward:`` was one flat section holding every regime's fields, and a cell's
hash covered them all (:data:`FLAT_LAYOUT`). A section adds the keys it lacks at those values
(:meth:`RewardSection.signature_extras`), so every cell trained before keeps its hash; a block several regimes
share (a study's regime axis, :class:`SharedBlock`) keeps the values it wrote for the other regimes there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from lorarl.grading.overrides import AnswerFormat, GradingOverride, check_grading
from lorarl.strict import Strict

# The other regimes' fields of the flat section as a cell's hash covered them (runtime fields and `terms` at its
# null never did), at their defaults: frozen, so a regime added later, or a default moved, rehashes no cell.
FLAT_LAYOUT: dict[str, Any] = {
    "incorrect_reward": 0.0, "step_separator": "\n", "prm": "rule", "rule_check": "arithmetic", "prm_model": None,
    "prm_step_tag": "ки", "prm_good_token": "+", "prm_bad_token": "-", "prm_device": None, "prm_max_length": None,
    "teacher": None, "teacher_device": None, "teacher_dtype": "auto"}


@dataclass(frozen=True)
class SharedBlock:
    """A ``reward:`` block shared by cells of several regimes (the regime set by an axis): the fields of this
    cell's regime, and those another regime's section holds, set aside for this cell (its signature only)."""

    fields: dict[str, Any]  # validated by the regime's section
    set_aside: dict[str, Any]  # another regime's fields: they never reach this cell's regime


class RewardSection(Strict):
    """The fields of every regime's ``reward:`` section."""

    regime: str = "outcome"  # which reward deposits (density axis): a registered regime (lorarl.rewards.registry)
    grading_timeout_s: float = Field(5.0, gt=0)  # math-verify time limit per completion (outcome, accuracy)
    answer_format: AnswerFormat = "boxed"  # what the prompt asks for and is graded: final \\boxed{} | DAPO's last "Answer:" line (003) | last number; evaluation grades the same way
    grading: GradingOverride = GradingOverride()  # math-verify settings of the training reward (boxed format; null = math-verify's defaults)
    _set_aside: dict[str, Any] = PrivateAttr(default_factory=dict)  # a shared block's fields of other regimes (JSON values): the signature's and the table's

    def signature_extras(self) -> dict[str, Any]:
        """The flat section's keys this regime's section lacks, at the values a shared block set aside for this
        cell or else at their defaults (the hashes of the cells trained before sections, unchanged)."""
        return {f: self._set_aside.get(f, v) for f, v in FLAT_LAYOUT.items() if f not in type(self).model_fields}

    @property
    def set_aside(self) -> dict[str, Any]:
        """The other regimes' fields a shared block wrote for this cell (JSON values; they never reach its regime)."""
        return dict(self._set_aside)

    def keep_aside(self, values: dict[str, Any]) -> "RewardSection":
        """This section with ``values`` set aside (other regimes' fields a shared block wrote, validated as JSON by
        lorarl.rewards.registry.reward_section)."""
        self._set_aside = dict(values)
        return self

    def written(self, field: str) -> Any:
        """A field as the study wrote it for this cell: this regime's, or one set aside (the teacher a study names
        for its teacher row, eval.teacher_benchmarks, whatever the regime); None if neither."""
        return getattr(self, field) if field in type(self).model_fields else self._set_aside.get(field)

    @model_validator(mode="after")
    def _grading_applies(self) -> "RewardSection":
        check_grading(self.grading, self.answer_format, "reward.grading")
        return self

