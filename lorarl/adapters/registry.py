"""The method registry: one `Method` subclass per `adapter.method`, registered by name with `@register`.

A method's class says, as data, which `AdapterConfig` fields apply to it (`fields`), the value each
applicable field takes when the cell leaves it null (`defaults`), and which inits / masks it accepts.
`register` checks that spec when the class is defined, and `check_config` (called by `AdapterConfig`'s
validator) rejects a cell that sets a field the method does not use, naming the field, the method and
the fields that do apply. Nothing here imports torch or peft: `lorarl.language.config` stays light.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from lorarl.adapters.names import INITS, MASKS, METHODS

# Every AdapterConfig field besides `method`, in resolution order (a default may read earlier fields).
FIELDS = ("rank", "alpha", "dropout", "target_modules", "init", "lr_ratio", "mask", "mask_alpha", "mask_rank",
          "mask_low_alpha", "budget")

class AdapterSpecError(ValueError):
    """A method spec or an adapter config is inconsistent; the message names the field."""


class Method:
    """Base class of a registered method. Subclasses set the class attributes; builders live in
    `lorarl.adapters.methods` and import torch/peft only inside their methods."""

    name: ClassVar[str]
    summary: ClassVar[str]
    peft_type: ClassVar[str | None]  # peft's PeftType value the built model must carry (None: no peft)
    fields: ClassVar[tuple[str, ...]] = ()  # AdapterConfig fields that apply
    defaults: ClassVar[Mapping[str, Any]] = {}  # value (or fn(resolved so far)) when a field is null
    inits: ClassVar[tuple[str, ...]] = ()  # allowed `init` values (empty: `init` does not apply)
    masks: ClassVar[tuple[str, ...]] = ()  # allowed `mask` values (empty: `mask` does not apply)

    def applicable(self, values: Mapping[str, Any]) -> tuple[str, ...]:
        """Fields that apply given the cell's values (a method may make some conditional)."""
        return self.fields

    def resolve(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The applied adapter settings: null applicable fields take the method's default."""
        out: dict[str, Any] = {"method": self.name}
        applies = self.applicable(values)
        for f in FIELDS:
            if f not in applies:
                continue
            v = values.get(f)
            if v is None:
                d = self.defaults.get(f)
                v = d(out) if callable(d) else d
            out[f] = v
        return out

    # Hooks implemented by concrete methods (lorarl.adapters.methods).
    def build(self, model: Any, applied: dict, ctx: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def make_optimizer(self, model: Any, applied: dict, ctx: Any) -> Any:
        return None  # None: the trainer builds its default AdamW

    def make_callbacks(self, model: Any, applied: dict, ctx: Any) -> list:
        return []

    def expect(self, obs: dict, applied: dict) -> list[str]:
        """Problems with an observed model (see fingerprint.observe) for this method; [] if it matches."""
        return []


REGISTRY: dict[str, Method] = {}


def _check_spec(cls: type[Method]) -> None:
    name = getattr(cls, "name", None)
    where = f"method spec {cls.__name__}"
    if name not in METHODS:
        raise AdapterSpecError(f"{where}: name {name!r} is not in lorarl.adapters.names.METHODS")
    if name in REGISTRY:
        raise AdapterSpecError(f"{where}: method {name!r} is registered twice")
    unknown = [f for f in cls.fields if f not in FIELDS]
    if unknown:
        raise AdapterSpecError(f"{where}: unknown fields {unknown}; allowed: {', '.join(FIELDS)}")
    stray = [f for f in cls.defaults if f not in cls.fields]
    if stray:
        raise AdapterSpecError(f"{where}: defaults for fields that do not apply: {stray}")
    if any(i not in INITS for i in cls.inits):
        raise AdapterSpecError(f"{where}: inits {cls.inits} not all in {INITS}")
    if any(m not in MASKS for m in cls.masks):
        raise AdapterSpecError(f"{where}: masks {cls.masks} not all in {MASKS}")
    if ("init" in cls.fields) != bool(cls.inits):
        raise AdapterSpecError(f"{where}: `init` must apply exactly when the method lists inits")
    if "init" in cls.fields and cls.defaults.get("init") not in cls.inits:
        raise AdapterSpecError(f"{where}: default init {cls.defaults.get('init')!r} not in {cls.inits}")
    if ("mask" in cls.fields) != bool(cls.masks):
        raise AdapterSpecError(f"{where}: `mask` must apply exactly when the method lists masks")
    if not getattr(cls, "summary", ""):
        raise AdapterSpecError(f"{where}: a one-line `summary` is required")


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: validate the spec and register one instance under `cls.name`."""
    _check_spec(cls)
    REGISTRY[cls.name] = cls()
    return cls
