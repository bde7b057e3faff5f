"""The study-language blocks of an adaptive study: `search:` (successive halving over rungs) and
`hypotheses:` (named comparisons with margins, tested sequentially over seeds).

Both are study-level decisions, never cell science: they are fields of the study, not of a cell's
config, so no cell's id, signature or evaluation signature depends on them (tests/language/test_adaptive_spec.py).
The field types and bounds are checked by pydantic when the study is parsed (lorarl.language.study); numeric fields are
strict (a quoted number such as ``eta: '3'`` is refused, not read as 3: a string there is a typo or a template
left unfilled, and a sweep over it would run something nobody wrote). What
depends on the study's axes and cells (paired axes, setting selectors, rungs against `train.steps`
and the snapshot steps, the metric against each cell's benchmarks) is checked by :func:`check_blocks`
once the cell table is built. Every error is a StudyError naming the field and what is allowed, so
`lorarl cells` exits 2 before anything is written. See docs/adaptive.md.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

from pydantic import Field, StrictInt, ValidationInfo, field_validator, model_validator

from lorarl.language.adaptive.seeds import added_values
from lorarl.language.matrix import NOT_APPLICABLE, StudyError, label_of
from lorarl.strict import Strict

__all__ = ["SearchSpec", "HypothesisSpec", "check_blocks", "check_metric", "split_metric", "resolved_search", "MAX_SEEDS"]

MAX_SEEDS = 50  # the largest seed cap a hypothesis may name (its boundaries are calibrated per design)
_METRIC = re.compile(r"^([A-Za-z0-9_]+)/((?:pass|avg)@\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def split_metric(text: str) -> tuple[str, str]:
    """``"gsm8k/pass@1"`` -> ``("gsm8k", "pass@1")``."""
    m = _METRIC.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not <benchmark>/<metric>; allowed: e.g. synthetic/pass@1, gsm8k/avg@8")
    return m.group(1), m.group(2)


def _metric_field(v: str | None) -> str | None:
    if v is not None:
        split_metric(v)
    return v


def _numeric(ann: Any) -> set[type]:
    """The number types a field's annotation holds (through lists, unions, optionals and Annotated)."""
    if ann in (int, float):
        return {ann}
    return set().union(*(_numeric(a) for a in typing.get_args(ann) if a is not ann)) if typing.get_args(ann) else set()


def _quoted(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and any(isinstance(v, str) for v in value))


class Unquoted(Strict):
    """Numeric fields refuse text, with a message naming what is allowed (pydantic's strict mode refuses it too,
    this says why): ``eta: '3'`` is not 3."""

    @field_validator("*", mode="before")
    @classmethod
    def _not_text(cls, value: Any, info: ValidationInfo) -> Any:
        f = cls.model_fields.get(info.field_name or "")
        kinds = _numeric(f.annotation) if f is not None else set()
        if not _quoted(value) or not kinds:
            return value
        kind = "a number" if float in kinds else "an integer"
        example = f.default if f.default is not None else [10, 30]
        raise ValueError(f"{value!r} is text (quoted); allowed: {kind} without quotes, e.g. {example}")


class SearchSpec(Unquoted):
    """`search:` successive halving over rungs (training steps at which the held-out metric is measured)."""

    rule: Literal["sha", "asha"] = "sha"  # sha: a rung decides once every live setting has its record; asha: promotes as records arrive
    rungs: list[StrictInt] | None = None  # training steps where settings are compared (snapshot steps < train.steps); null = eval_every x eta^k
    metric: str | None = None  # `<benchmark>/<metric>` read at each rung (a curve benchmark); null = the first curve benchmark's headline
    direction: Literal["max", "min"] = "max"  # whether a higher (max) or lower (min) rung value is better
    eta: int = Field(3, ge=2, strict=True)  # reduction factor: a rung keeps the best 1/eta of its settings
    min_kept: int = Field(1, ge=1, strict=True)  # a rung keeps at least this many settings (whatever eta says)
    paired: list[str] | None = None  # axes whose cells form one setting, averaged and kept or stopped together; null = [seed_axis]

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str | None) -> str | None:
        return _metric_field(v)

    @field_validator("rungs")
    @classmethod
    def _rungs(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is empty; allowed: at least one training step, e.g. [10, 30]")
        if any(s < 1 for s in v) or list(v) != sorted(set(v)):
            raise ValueError(f"{v} must be positive training steps in increasing order, each once")
        return v


class HypothesisSpec(Unquoted):
    """One named comparison `a` vs `b` on the study's headline metric, paired by seed and problem."""

    kind: Literal["superiority", "non_inferiority", "equivalence"]  # which claim about d = a - b is tested
    a: dict[str, Any] = Field(min_length=1)  # the setting compared: {axis: label} of every non-seed axis
    b: dict[str, Any] = Field(min_length=1)  # the reference setting, same form
    margin: float = Field(0.0, ge=0, strict=True)  # in metric units: superiority d > margin; non-inferiority d > -margin; equivalence |d| < margin
    alpha: float = Field(0.05, gt=0, lt=0.5, strict=True)  # error rate of the claim, valid at every look (one added seed = one look)
    min_seeds: int = Field(3, ge=2, strict=True)  # seeds of both settings before the first look (the interval needs a spread)
    max_seeds: int = Field(12, ge=2, le=MAX_SEEDS, strict=True)  # the seed cap: no seed is added past it (the design's last look); 12 with rho 1.5: 34-40% fewer seeds than the fixed design of equal power (docs/adaptive.md)
    spending: float = Field(1.5, gt=0, le=10, strict=True)  # rho of the alpha spending function alpha * (n / max_seeds)^rho (1 ~ Pocock, 3 ~ O'Brien-Fleming)
    metric: str | None = None  # `<benchmark>/<metric>` of the final evaluation; null = the study's headline (first benchmark's)
    direction: Literal["max", "min"] = "max"  # whether a higher (max) or lower (min) metric is better (min: d = b - a)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str | None) -> str | None:
        return _metric_field(v)

    @model_validator(mode="after")
    def _design(self) -> "HypothesisSpec":
        if self.min_seeds > self.max_seeds:
            raise ValueError(f"min_seeds {self.min_seeds} > max_seeds {self.max_seeds}; allowed: "
                             f"min_seeds <= max_seeds")
        if self.kind in ("non_inferiority", "equivalence") and self.margin <= 0:
            raise ValueError(f"margin must be > 0 for kind {self.kind} (a margin of 0 is not testable); "
                             f"allowed: a positive difference in metric units, e.g. 0.02")
        return self


# ---------------------------------------------------------------------------------------------
# Checks against the study's axes and cells
# ---------------------------------------------------------------------------------------------


def _fail(source: str, msg: str) -> StudyError:
    return StudyError(f"invalid study {source}: {msg}")


def _labels(study: Any, axis: str) -> list[str]:
    return [label_of(v) for v in study.axes[axis].values]


def _headline(cfg: Any, bench: str) -> str:
    from lorarl.language.evalplan.plan import benchmark_specs, protocol_for

    spec = benchmark_specs(cfg)[bench]
    return spec.headline or protocol_for(bench, spec, cfg.eval).primary_metric


def check_metric(table: Any, metric: str | None, where: str, source: str, curve: bool) -> str:
    """The metric every cell records (``<bench>@<step>`` snapshots when ``curve``, else the final
    evaluation); a null metric resolves to the first (curve) benchmark's headline."""
    from lorarl.language.evalplan.plan import benchmark_specs, curve_benchmarks, protocol_for

    out = None
    for cell in table.cells:
        cfg = cell.config
        benches = curve_benchmarks(cfg) if curve else list(benchmark_specs(cfg))
        bench, name = split_metric(metric) if metric else (benches[0], _headline(cfg, benches[0]))
        if bench not in benches:
            what = "curve benchmarks (eval.curve_benchmarks, evaluated at each snapshot)" if curve else "benchmarks"
            raise _fail(source, f"{where}: benchmark {bench!r} is not one of cell {cell.id}'s {what}; "
                                f"allowed: {', '.join(benches)}")
        names = protocol_for(bench, benchmark_specs(cfg)[bench], cfg.eval).metric_names
        if name not in names:
            raise _fail(source, f"{where}: {name!r} is not a metric of {bench}'s protocol in cell {cell.id}; "
                                f"allowed: {', '.join(f'{bench}/{n}' for n in names)}")
        if out is not None and out != f"{bench}/{name}":
            raise _fail(source, f"{where}: the cells' headlines differ ({out} vs {bench}/{name}); allowed: name "
                                f"the metric, e.g. {where} = {out}")
        out = f"{bench}/{name}"
    assert out is not None
    return out


def _derived_rungs(table: Any, eta: int, source: str) -> list[int]:
    everys = {c.config.eval.eval_every for c in table.cells}
    steps = {c.config.train.steps for c in table.cells}
    if len(everys) != 1 or len(steps) != 1:
        raise _fail(source, "search.rungs: the cells differ in eval.eval_every or train.steps, so no rungs "
                            "can be derived; allowed: list the rungs, e.g. search.rungs = [10, 30]")
    every, last = everys.pop(), steps.pop()
    if every == 0:
        raise _fail(source, "search.rungs: null needs held-out snapshots (defaults.eval.eval_every > 0); "
                            "allowed: set eval.eval_every (rungs = eval_every x eta^k) or list the rungs")
    out, r = [], every
    while r < last:
        out.append(r)
        r *= eta
    if not out:
        raise _fail(source, f"search.rungs: eval.eval_every {every} leaves no rung below train.steps {last}; "
                            f"allowed: eval.eval_every < train.steps")
    return out


def resolved_search(study: Any, table: Any) -> SearchSpec:
    """The `search:` block with its defaults filled in (rungs, metric, paired axes): what the ledger
    records as the rule's inputs. Call after :func:`check_blocks` (load_study does)."""
    s = study.search
    rungs = s.rungs or _derived_rungs(table, s.eta, "<study>")
    metric = s.metric or check_metric(table, None, "search.metric", "<study>", curve=True)
    return s.model_copy(update={"rungs": rungs, "metric": metric, "paired": s.paired or [study.seed_axis]})


def _check_search(study: Any, table: Any, source: str) -> None:
    from lorarl.language.evalplan.plan import snapshot_steps

    s = study.search
    for ax in s.paired or [study.seed_axis]:
        if ax not in study.axes:
            raise _fail(source, f"search.paired: {ax!r} is not an axis of the study; allowed: "
                                f"{', '.join(study.axes) or '(the study has no axes)'}")
    rungs = s.rungs or _derived_rungs(table, s.eta, source)
    for cell in table.cells:
        steps, snaps = cell.config.train.steps, snapshot_steps(cell.config)
        for r in rungs:
            if r >= steps:
                raise _fail(source, f"search.rungs: {r} is not below cell {cell.id}'s train.steps {steps}; "
                                    f"allowed: steps < {steps} (the last step is the end, not a rung)")
            if r not in snaps:
                every = cell.config.eval.eval_every
                raise _fail(source, f"search.rungs: step {r} has no held-out snapshot in cell {cell.id} "
                                    f"(eval.eval_every {every}); allowed: "
                                    + (f"multiples of {every} below {steps}" if every else
                                       "set defaults.eval.eval_every so that every rung is a multiple of it"))
    check_metric(table, s.metric, "search.metric", source, curve=True)
    from lorarl.language.adaptive.settings import study_settings

    n = len(study_settings(study, table, s.paired or [study.seed_axis]))
    if s.min_kept >= n:
        raise _fail(source, f"search.min_kept: {s.min_kept} keeps every one of the study's {n} setting(s) at every "
                            f"rung, so the search can stop nothing; allowed: min_kept < {n}"
                            + ("" if n > 1 else " (a study with one setting has nothing to search: drop `search:`)"))


def _setting_of(study: Any, table: Any, name: str, side: str, sel: dict[str, Any], source: str) -> tuple:
    where = f"hypotheses.{name}.{side}"
    free = [a for a in study.axes if a != study.seed_axis]
    for ax, lab in sel.items():
        if ax not in free:
            raise _fail(source, f"{where}: {ax!r} is not a non-seed axis; allowed: {', '.join(free) or '(none)'}")
        if label_of(lab) not in _labels(study, ax) + [NOT_APPLICABLE]:
            raise _fail(source, f"{where}.{ax}={lab!r} is not a value of that axis; allowed: "
                                f"{', '.join(_labels(study, ax) + [NOT_APPLICABLE])}")
    missing = [a for a in free if a not in sel and len(study.axes[a].values) > 1]
    if missing:
        raise _fail(source, f"{where}: names no label of axis {', '.join(missing)}; allowed: one label of every "
                            f"non-seed axis with several values, so that it names one setting")
    want = {a: label_of(v) for a, v in sel.items()}
    cells = [c for c in table.cells if all(c.axes.get(a) == lab for a, lab in want.items())]
    if not cells:
        raise _fail(source, f"{where}: no cell of the study has {want} (excluded, or merged into another "
                            f"setting); allowed: a setting the study runs")
    return tuple(sorted((a, c) for a, c in cells[0].axes.items() if a != study.seed_axis))


def _check_hypotheses(study: Any, table: Any, source: str) -> None:
    if study.seed_axis not in study.axes:
        raise _fail(source, f"hypotheses: pair by seed, but seed_axis {study.seed_axis!r} is not an axis; allowed: "
                            f"a study with a seed axis ({', '.join(study.axes) or 'no axes'})")
    for name, h in study.hypotheses.items():
        if not _NAME.match(name):
            raise _fail(source, f"hypotheses: name {name!r} must be letters, digits, '_' or '-'")
        a = _setting_of(study, table, name, "a", h.a, source)
        b = _setting_of(study, table, name, "b", h.b, source)
        if a == b:
            raise _fail(source, f"hypotheses.{name}: a and b name the same setting; allowed: two different settings")
        check_metric(table, h.metric, f"hypotheses.{name}.metric", source, curve=False)
        have = len(study.axes[study.seed_axis].values)
        if h.max_seeds > have:  # seeds added at run time continue the axis's integers (lorarl.language.adaptive.seeds)
            try:
                added_values(study)
            except ValueError:
                raise _fail(source, f"hypotheses.{name}.max_seeds: {h.max_seeds} needs seeds beyond the {have} of "
                                    f"axis {study.seed_axis!r}, which are added as the integers after its largest, but "
                                    f"its values are not integers; allowed: max_seeds <= {have}, or integer seeds") from None


def check_blocks(study: Any, table: Any, source: str = "<study>") -> None:
    """Refuse a `search:` or `hypotheses:` block the study cannot honour (StudyError naming the field
    and the allowed values). ``table``: the study's CellTable."""
    if study.search is None and not study.hypotheses:
        return
    if any(getattr(c.config, "eval", None) is None for c in table.cells):
        block = "search" if study.search is not None else "hypotheses"
        raise _fail(source, f"{block}: needs held-out evaluations, which study kind {study.kind!r} does not have; "
                            f"allowed: a study of kind grpo")
    if study.search is not None:
        _check_search(study, table, source)
    if study.hypotheses:
        _check_hypotheses(study, table, source)
