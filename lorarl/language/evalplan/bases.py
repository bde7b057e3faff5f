"""Base pseudo-cells: the untrained model (the lr = 0 anchor), evaluated once per *evaluation setting*.

A base row is only a fair anchor when the untrained model is asked the same way as the cells it
anchors: same prompt (template, system prompt, chat template, think format), same answer format and
grading, same benchmarks and protocols.  So the bases of a study are keyed by (model, base
evaluation signature): the :func:`lorarl.language.evalplan.plan.eval_signature` of every final benchmark of
a cell with ``is_base=True`` (weights = the model), the sampling seed held at the group's first
cell's (a seed axis is averaged over, it does not make bases).  A study with one prompt keeps one
base per model, named as before: ``base`` (one model) or ``base-<model>``.  A study with a prompt
axis gets one base per prompt, named after the axis labels that tell the groups apart
(``base-pchat``, ``base-Qwen2.5-0.5B-pchat``), else after a short hash of the key; each base's
``axes`` carry those labels, so tables and figures say which prompt a base row was asked with.
``eval.base_prompts`` gives a base row its own prompt settings (chat template, thinking mode):
``base`` for the untrained student rows, ``teacher`` for the teacher row; they are part of that
row's prompt, hence of its evaluation signature, and of no trained cell's.
"""

from __future__ import annotations

import re
from typing import Any

from lorarl.language.signature import short_hash

_SAFE = re.compile(r"[^A-Za-z0-9._+-]")  # as lorarl.language.matrix (cell ids)


def row_config(cfg: Any, row: str) -> Any:
    """A cell config as base row ``row`` (``base``: an untrained student row, ``teacher``) is asked:
    its prompt with ``eval.base_prompts.<row>`` in place of the study's (lorarl.language.prompt)."""
    own = (cfg.eval.base_prompts or {}).get(row)
    prompt = own.apply(cfg.prompt, row) if own is not None else cfg.prompt
    return cfg if prompt == cfg.prompt else cfg.model_copy(update={"prompt": prompt})


def _eval_key(cfg: Any, seed: int) -> tuple[str, ...]:
    """The base evaluation signature of a cell config (seed held fixed)."""
    from lorarl.language.evalplan.plan import benchmark_specs, eval_signature

    cfg = cfg if cfg.seed == seed else cfg.model_copy(update={"seed": seed})
    return tuple(eval_signature(cfg, b, None, is_base=True) for b in benchmark_specs(cfg))


def _distinguishing(study: Any, groups: list[list[Any]]) -> list[str]:
    """Axes (not the seed axis) with one label inside every group and not the same label in all
    groups, when their labels together tell every group apart (else [])."""
    seed_axis = getattr(study, "seed_axis", "seed")
    names = []
    for name in study.axes:
        labels = [{c.axes.get(name) for c in g} for g in groups]
        if name != seed_axis and all(len(ls) == 1 for ls in labels) and len(set.union(*labels)) > 1:
            names.append(name)
    keys = {tuple(g[0].axes.get(n) for n in names) for g in groups}
    return names if len(keys) == len(groups) else []


def base_cells(study: Any, cells: list[Any], cell_cls: Any) -> list[Any]:
    """The base pseudo-cells of a grpo study's ``cells`` (see the module doc)."""
    models = list(dict.fromkeys(c.config.model for c in cells))
    out = []
    for m in models:
        mine = [c for c in cells if c.config.model == m]
        seed = mine[0].config.seed
        groups: dict[tuple[str, ...], list[Any]] = {}
        for c in mine:
            groups.setdefault(_eval_key(row_config(c.config, "base"), seed), []).append(c)
        short = _SAFE.sub("_", m.rstrip("/").split("/")[-1].split(":")[-1])
        axes = _distinguishing(study, list(groups.values())) if len(groups) > 1 else []
        for key, members in groups.items():
            first = members[0]
            labels = {a: first.axes[a] for a in axes}
            parts = ["base"] + ([short] if len(models) > 1 else [])
            if len(groups) > 1:
                frag = "-".join(f"{study.axes[a].prefix}{lab}" for a, lab in labels.items())
                parts.append(_SAFE.sub("_", frag).strip("_.") or short_hash(key)[:6])
            sig = {"base_model": m} if len(groups) == 1 else {"base_model": m, "eval": list(key)}
            cfg = row_config(first.config, "base")
            cfg = cfg if cfg.seed == seed else cfg.model_copy(update={"seed": seed})
            out.append(cell_cls("-".join(parts), {"model": m, **labels}, cfg, short_hash(sig), (),
                                first.eval_hash))
    return out + _teacher_bases(cells, cell_cls)


def _teacher_bases(cells: list[Any], cell_cls: Any) -> list[Any]:
    """``eval.teacher_benchmarks``: the distillation teacher as one more base row, asked as the students
    are (their prompt and grading, with ``eval.base_prompts.teacher`` in place of the prompt's settings
    it names: paper 001's Qwen3-8B answers in its chat format) on those benchmarks only (paper 001
    Table 2's teacher column)."""
    from lorarl.language.evalplan.plan import benchmark_specs, eval_signature

    out, seen = [], set()
    for c in cells:
        cfg = c.config
        names = cfg.eval.teacher_benchmarks
        teacher = cfg.reward.written("teacher")  # the distillation teacher, or one named for this row only
        if not names or not teacher or teacher in seen:
            continue
        seen.add(teacher)
        ev = cfg.eval.model_copy(update={"benchmarks": {b: cfg.eval.benchmarks[b] for b in names},
                                         "curve_benchmarks": None, "eval_every": 0})
        tcfg = row_config(cfg, "teacher").model_copy(update={"model": teacher, "eval": ev})
        key = tuple(eval_signature(tcfg, b, None, is_base=True) for b in benchmark_specs(tcfg))
        short = _SAFE.sub("_", teacher.rstrip("/").split("/")[-1].split(":")[-1])
        out.append(cell_cls(f"teacher-{short}", {"model": teacher, "role": "teacher"}, tcfg,
                            short_hash({"base_model": teacher, "eval": list(key)}), (), short_hash(list(key))))
    return out


def base_label(model: str, axes: dict[str, Any] | None = None) -> str:
    """How a base row is named in tables and figures: ``base (model)``, plus the axis labels of a
    base that is one of several (``base (model, prompt=chat)``)."""
    extra = ", ".join(f"{k}={v}" for k, v in (axes or {}).items() if k != "model")
    return f"base ({model}{', ' + extra if extra else ''})"
