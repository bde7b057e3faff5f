"""Reward regimes by name: imports every module of this package (each regime registers itself with
``lorarl.rewards.register_regime``), validates a cell's ``reward:`` block with the section its regime names
(:func:`reward_section`: a union discriminated by ``regime`` over the registry), builds a cell's regime from it
and answers for the regime's facts (:class:`lorarl.rewards.RegimeSpec`: its section, the models it loads)."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable

from pydantic import TypeAdapter, ValidationError

from lorarl.rewards import REGIMES, ExtraModel, Regime, RegimeSpec
from lorarl.rewards.section import RewardSection, SharedBlock


def load_all() -> dict[str, RegimeSpec]:
    """Import every module of lorarl/rewards/ (registration happens at import); name -> spec."""
    _import_all()
    return REGIMES


@functools.cache
def _import_all() -> None:
    """The package's modules imported once per process (a cell's validation asks the registry thousands of
    times: scanning the folder each time was most of `lorarl cells` of a 54-cell study)."""
    for mod in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if mod.name != "registry":
            importlib.import_module(f"lorarl.rewards.{mod.name}")


def regime_names() -> tuple[str, ...]:
    """The allowed values of ``reward.regime``, sorted (import order must not change messages)."""
    return tuple(sorted(load_all()))


def spec_of(regime: str) -> RegimeSpec:
    """The registered spec of ``reward.regime`` (ValueError naming the allowed values otherwise)."""
    regimes = load_all()
    if not isinstance(regime, str) or regime not in regimes:
        raise ValueError(f"unknown reward.regime {regime!r}; allowed: {', '.join(regime_names())}")
    return regimes[regime]


def sections() -> list[type[RewardSection]]:
    """Every registered regime's section, in the order of the regimes' names."""
    return [spec_of(n).section for n in regime_names()]


def reward_section(value: Any) -> RewardSection:
    """A study's ``reward:`` block validated by the section of the regime it names (default ``outcome``); a
    field that section lacks is an error naming the regime, its fields and the regimes that take that field."""
    if isinstance(value, RewardSection):
        return value
    block = value if isinstance(value, SharedBlock) else SharedBlock(value, {})
    if not isinstance(block.fields, dict):
        raise ValueError(f"expected a mapping of reward settings, got {block.fields!r}")
    regime = block.fields.get("regime", "outcome")
    try:
        section = spec_of(regime).section
    except ValueError as err:
        raise _refused("regime", regime, str(err)) from None
    for f in block.fields:
        if f not in section.model_fields:
            takers = " / ".join(repr(n) for n in regime_names() if f in spec_of(n).section.model_fields)
            taken = f"applies to reward.regime {takers}" if takers else "is no field of any reward regime"
            raise _refused(f, block.fields[f], f"reward.{f} {taken}; allowed with regime {regime!r}: "
                                               f"{', '.join(section.model_fields)}")
    return section.model_validate(block.fields).keep_aside(_as_json(block.set_aside))


def _as_json(values: dict[str, Any]) -> dict[str, Any]:
    """Set-aside values validated by the field of the regime that holds each, as the JSON it would dump."""
    out = {}
    for f, v in values.items():
        holder = next(s for s in sections() if f in s.model_fields)
        field = TypeAdapter(Annotated[holder.model_fields[f].annotation, holder.model_fields[f]])
        try:
            out[f] = field.dump_python(field.validate_python(v), mode="json")
        except ValidationError as err:
            raise _refused(f, v, f"reward.{f}: {err.errors()[0]['msg']}") from None
    return out


def _refused(field: str, value: Any, why: str) -> ValidationError:
    """A validation error at ``field`` of the section (a study's error then points at `reward.<field>`)."""
    return ValidationError.from_exception_data("reward", [{"type": "value_error", "loc": (field,), "input": value,
                                                           "ctx": {"error": ValueError(why)}}])


def shared_block(block: Any, strict: Iterable[str] = ()) -> Any:
    """``block`` (a cell's ``reward:`` block in a study's table, which holds every regime's fields: :func:`flat_block`)
    with the fields of the other regimes' sections set aside for this cell (:class:`SharedBlock`), except those in
    ``strict`` (an axis set them for a regime that no axis changes: :func:`reward_section` names them)."""
    if not isinstance(block, dict) or block.get("regime", "outcome") not in load_all():
        return block  # reward_section names the problem
    own = spec_of(block.get("regime", "outcome")).section.model_fields
    aside = {f: v for f, v in block.items() if f not in own and f not in strict and f in _all_fields()}
    return SharedBlock({f: v for f, v in block.items() if f not in aside}, aside) if aside else block


def aside_for_evaluation(block: Any, fields: Iterable[str]) -> Any:
    """``block`` with ``fields`` set aside where its regime's section lacks them: a setting another section reads
    (the teacher of eval.teacher_benchmarks' row, whatever the regime) stays the cell's without reaching its regime."""
    shared = block if isinstance(block, SharedBlock) else SharedBlock(block, {})
    if not isinstance(shared.fields, dict) or shared.fields.get("regime", "outcome") not in load_all():
        return block
    own = spec_of(shared.fields.get("regime", "outcome")).section.model_fields
    move = {f: shared.fields[f] for f in fields if f in shared.fields and f not in own}
    if not move:
        return block
    return SharedBlock({f: v for f, v in shared.fields.items() if f not in move}, {**shared.set_aside, **move})


def flat_block(section: RewardSection) -> dict[str, Any]:
    """A study table's ``reward:`` block built from its validated defaults: every registered regime's fields (at their
    defaults, or as the defaults wrote them), so an axis may set any of them and each cell takes its regime's."""
    return {**_all_fields(), **section.set_aside, **section.model_dump(mode="json")}


def _all_fields() -> dict[str, Any]:
    """Every registered regime section's field -> its default, as JSON."""
    out: dict[str, Any] = {}
    for s in sections():
        out.update(s.model_construct().model_dump(mode="json"))
    return out


def extra_models(cfg: Any) -> list[ExtraModel]:
    """The models the regime of ``cfg`` (its reward section) loads beside the policy: a teacher, a PRM, none."""
    return spec_of(cfg.regime).extra_models(cfg)


def build_regime(cfg: Any, tokenizer: Any, *, resolve: Callable[[str], str] | None = None,
                 device: str = "cpu", temperature: float = 1.0) -> Regime:
    """The cell's regime from its ``reward:`` config (teacher/PRM models are loaded by its builder).
    ``cfg``: the cell's reward section (:func:`reward_section`). ``resolve``: what a model name of
    the config loads from (``local:<recipe>`` -> its build folder: lorarl.models.resolve_model, handed in
    by the caller for the same reason); None: names load as written."""
    return spec_of(cfg.regime).build(cfg, tokenizer, resolve=resolve, device=device, temperature=temperature)
