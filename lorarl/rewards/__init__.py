"""Reward regimes: every regime turns rollouts into reward *deposits* at token positions.

Regimes register themselves: one module per regime (``@register_regime``), found and built by
:mod:`lorarl.rewards.registry` (``build_regime``, ``regime_names``). Today's:

* ``outcome`` (:mod:`lorarl.rewards.outcome`): one deposit on the last completion token, 1 if the
  answer equals the gold answer, else 0: the boxed answer under math-verify, or the text rule
  ``reward.answer_format`` names (:mod:`lorarl.grading.answer_formats`: DAPO's ``Answer:`` line).
* ``process`` (:mod:`lorarl.rewards.process`): one deposit on the token that closes each reasoning
  step (steps split on a separator); value = a process reward model's score for that step. The PRM
  never sees the gold answer. Backends: a rule-based step checker for the synthetic task and a
  Math-Shepherd-style Hugging Face PRM.
* ``distillation`` (:mod:`lorarl.rewards.distillation`): a deposit on every completion token,
  ``log pi_T(o_t|s_t) - log pi_theta(o_t|s_t)``, the teacher scoring the student's exact tokens.

:class:`Deposits` is all the loss ever sees (through :mod:`lorarl.train.advantages`); the loss never
branches on the regime. The trainer builds a :class:`Rollouts` per generation batch.

A regime's facts live with it, never as a test of its name elsewhere (tests/project/test_structure.py holds this):
what the trainer asks of a built regime are attributes of :class:`Regime` (``needs_gold``,
``reports_accuracy``, ``needs_student_logps``); what the planners ask of a cell's ``reward:`` config (the
models it loads, its reward range) are fields of its :class:`RegimeSpec`, and so is its ``reward:`` section (the
fields it takes and their checks, on :class:`lorarl.rewards.section.RewardSection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from lorarl.rewards.section import RewardSection

if TYPE_CHECKING:
    import torch



@dataclass
class Rollouts:
    """One generation batch as the deposit functions see it (B completions, groups contiguous)."""

    prompts: list[str]  # prompt texts (what a PRM may read as the question)
    completions: list[str]  # completion texts
    prompt_ids: list[list[int]]  # prompt token ids, unpadded
    completion_ids: list[list[int]]  # completion token ids, unpadded (EOS included when emitted)
    token_texts: list[list[str]] = field(default_factory=list)  # decoded text of each completion token
    answers: list[str] | None = None  # gold answers: only a regime with `needs_gold` (outcome) is handed them
    student_logps: list[list[float]] | None = None  # log pi_theta of each completion token (distillation)

    def __len__(self) -> int:
        return len(self.completion_ids)


@dataclass
class Deposits:
    """Per completion: reward values deposited at completion-token positions (0-based)."""

    positions: list[list[int]]
    values: list[list[float]]
    dense: bool = False  # one deposit on every completion token: the advantage rule skips the reverse cumsum

    def __post_init__(self) -> None:
        if len(self.positions) != len(self.values):
            raise ValueError("positions and values must list the same completions")
        for i, (p, v) in enumerate(zip(self.positions, self.values)):
            if len(p) != len(v):
                raise ValueError(f"completion {i}: {len(p)} positions but {len(v)} values")

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def counts(self) -> list[int]:
        return [len(p) for p in self.positions]

    @property
    def totals(self) -> list[float]:
        """Per-completion return (sum of its deposits): the scalar 'reward' logged by TRL."""
        return [float(sum(v)) for v in self.values]

    def add(self, row: int, position: int, value: float) -> None:
        """Add ``value`` to the deposit of ``row`` at ``position`` (creating it if absent)."""
        pos = self.positions[row]
        if position in pos:
            self.values[row][pos.index(position)] += value
        else:
            pos.append(position)
            self.values[row].append(value)

    def flat(self, device: Any = None) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """``(row_D, pos_D, val_D)`` tensors over all D deposits of the batch."""
        import torch

        rows = [i for i, p in enumerate(self.positions) for _ in p]
        pos = [x for p in self.positions for x in p]
        val = [x for v in self.values for x in v]
        return (torch.tensor(rows, dtype=torch.long, device=device),
                torch.tensor(pos, dtype=torch.long, device=device),
                torch.tensor(val, dtype=torch.float32, device=device))


class Regime(Protocol):
    """What the trainer needs from a reward regime."""

    name: str  # its `reward.regime` name
    needs_student_logps: bool  # the trainer must fill Rollouts.student_logps
    needs_gold: bool  # the trainer hands it the gold answers (Rollouts.answers; None for a regime without)
    reports_accuracy: bool  # its grade is the accuracy metric (its `last_correct`); else the trainer grades apart

    def deposits(self, rollouts: Rollouts) -> Deposits: ...


@dataclass(frozen=True)
class ExtraModel:
    """A model a regime loads beside the policy, as the planners see it (local recipes to build, hub check,
    memory plan, training ranks)."""

    role: str  # its name in the memory plan ("teacher", "prm")
    field: str  # the config field naming it ("reward.teacher"): the hub check's messages
    model: str | None  # the field's value: HF id, path or `local:<recipe>`
    dtype: str  # dtype of its weights ("auto": the checkpoint's): the memory plan's bytes per parameter
    batch_size: int  # sequences per forward: the memory plan's activations
    local_recipe: bool  # a `local:<recipe>` value is built by the workflow and resolved (lorarl.models)
    device_field: str = ""  # the reward field placing it ("teacher_device"): the job's second GPU when it has one (lorarl.memory.auto)


def _no_models(cfg: Any) -> list[ExtraModel]:
    return []


def _unknown_range(cfg: Any) -> tuple[float, float] | None:
    return None


@dataclass(frozen=True)
class RegimeSpec:
    """A registered regime: its builder and the facts of its ``reward:`` config the planners read."""

    name: str  # its `reward.regime` value
    build: Callable[..., Regime]  # (cfg: its section, tokenizer, *, resolve, device, temperature) -> Regime
    section: type[RewardSection] = RewardSection  # its `reward:` section: the fields it takes, their checks (a teacher named, ...)
    extra_models: Callable[[Any], list[ExtraModel]] = _no_models  # the models it loads for this config (teacher, PRM)
    reward_range: Callable[[Any], tuple[float, float] | None] = _unknown_range  # per-completion reward before overlong shaping (report axes); None: unbounded or unknown


# `reward.regime` name -> its RegimeSpec. Each regime module of this package registers its own
# (`@register_regime`); lorarl.rewards.registry imports them all, builds a cell's regime and answers for
# its facts. Adding a regime = adding one module (+ its test).
REGIMES: dict[str, RegimeSpec] = {}


def register_regime(name: str, **facts: Any) -> Callable[[Callable[..., Regime]], Callable[..., Regime]]:
    """Decorator of a regime's builder ``build(cfg, tokenizer, *, resolve, device, temperature)``; ``facts``:
    the other fields of its :class:`RegimeSpec`."""
    def deco(fn: Callable[..., Regime]) -> Callable[..., Regime]:
        if name in REGIMES:
            raise ValueError(f"reward regime {name!r} registered twice")
        REGIMES[name] = RegimeSpec(name, fn, **facts)
        return fn
    return deco


def decode_tokens(tokenizer: Any, ids_list: list[list[int]]) -> list[list[str]]:
    """The text of each token on its own (special tokens → ''), one batched decode call."""
    flat = [[t] for ids in ids_list for t in ids]
    texts = tokenizer.batch_decode(flat, skip_special_tokens=True) if flat else []
    out, k = [], 0
    for ids in ids_list:
        out.append(texts[k:k + len(ids)])
        k += len(ids)
    return out


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max - buffer`` tokens, then linear down to -factor."""
    if buffer <= 0:
        return 0.0
    start = max_length - buffer
    if length <= start:
        return 0.0
    if length <= max_length:
        return factor * (start - length) / buffer
    return -factor
