"""Generated malformed studies: `python -m lorarl.badstudies` checks that each one is refused cleanly.

`cases()` derives well over 100 broken studies from one valid study: wrong types (every typed field
of every config section), unknown fields, bad axis values, booleans where numbers go, conflicting axes, impossible protocols,
unknown benchmarks / methods / tasks, missing files, YAML syntax errors and duplicate keys, and unsafe
names (path separators, `..`, absolute paths, empty names) in study names, axis names, prefixes and
labels, and studies too large to expand (a million cells, alias bombs: lorarl.badstudies_size). `check(case)` runs `lorarl cells <file>` in a scratch directory and requires: exit status 2,
a message naming the file, the place (YAML line when YAML gives one, the field path otherwise) and
what is allowed, nothing written in the scratch directory, and a traceback never shown.
Separately `id_escapes` checks that no cell id or derived path of a *valid* study with hostile labels
can leave `results/`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

VALID: dict[str, Any] = {
    "name": "bad",
    "defaults": {
        "model": "local:tiny-test",
        "task": {"name": "synthetic", "n_train": 16, "n_eval": 8},
        "adapter": {"method": "lora", "rank": 2, "alpha": 4},
        "train": {"steps": 4, "prompts_per_step": 2, "generations": 2, "lr": 1.0e-3},
        "eval": {"max_new_tokens": 8},
    },
    "axes": {
        "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 2]},
        "seed": {"field": "seed", "prefix": "s", "values": [0, 1]},
    },
}

# what "names the allowed values" looks like in a message (a list, a type, a bound or a pattern)
ALLOWED = re.compile(r"allowed|should be|must be|expected|one of|letters|input should|greater|less|at least|"
                     r"at most|required|once per mapping|not a valid|no such|only|use |drop it|fix the", re.I)


@dataclass
class Case:
    category: str
    name: str
    text: str  # the YAML file content
    place: str  # a fragment the message must contain (field path, axis, or "line N")


def _dump(d: dict) -> str:
    return yaml.safe_dump(d, sort_keys=False)


def with_field(path: str, value: Any, base: dict | None = None) -> dict:
    """A deep copy of ``base`` (default: the valid study) with the dotted field ``path`` set to ``value``."""
    d = copy.deepcopy(base or VALID)
    keys = path.split(".")
    node = d
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return d


def _wrong_value(annotation: Any, default: Any) -> Any:
    """A value of the wrong type for a field (a string where numbers/bools go, a mapping elsewhere)."""
    text = str(annotation)
    if "int" in text or "float" in text or "bool" in text:
        return "not-a-number"
    return {"nested": "mapping"}


def _typed_fields() -> list[tuple[str, Any, Any]]:
    """(dotted path, annotation, default) of every leaf field of CellConfig's sections."""
    from pydantic import BaseModel

    from lorarl.language.config import CellConfig

    out = []

    def walk(cls: type[BaseModel], prefix: str) -> None:
        for name, f in cls.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            elif "dict" not in str(ann) and "Any" not in str(ann):
                out.append((f"{prefix}{name}", ann, f.default))

    walk(CellConfig, "")
    return out


def wrong_types() -> list[Case]:
    out = []
    for path, ann, default in _typed_fields():
        if path == "model":
            continue  # any string is a model name
        value = _wrong_value(ann, default)
        if isinstance(value, str) and "str" in str(ann):
            continue  # a string is allowed there
        out.append(Case("wrong type", f"defaults.{path}={value!r}", _dump(with_field(f"defaults.{path}", value)),
                        f"defaults.{path}"))
    return out


def unknown_fields() -> list[Case]:
    out = [Case("unknown field", "top-level axess", _dump({**VALID, "axess": {}}), "axess"),
           Case("unknown field", "axis key feild", _dump(with_field("axes.rank.feild", "adapter.rank")), "feild")]
    for sec in ("task", "adapter", "train", "eval", "reward"):
        out.append(Case("unknown field", f"defaults.{sec}.typo", _dump(with_field(f"defaults.{sec}.stepz", 3)),
                        f"defaults.{sec}.stepz"))
    out.append(Case("unknown field", "defaults.trian section", _dump(with_field("defaults.trian", {"steps": 2})),
                    "defaults.trian"))
    out.append(Case("unknown field", "axis field path typo", _dump(with_field("axes.rank.field", "adapter.rnak")),
                    "adapter.rnak"))
    out.append(Case("unknown field", "bundle sets unknown field",
                    _dump(with_field("axes.rank.values", [{"label": "x", "set": {"train.lrr": 1}}])), "train.lrr"))
    return out


def bad_axis_values() -> list[Case]:
    bad = [("rank below 1", "adapter.rank", [0, 2]), ("rank as text", "adapter.rank", ["big"]),
           ("negative lr", "train.lr", [-1.0]), ("steps zero", "train.steps", [0]),
           ("unknown method", "adapter.method", ["lora", "lorax"]), ("dropout 1", "adapter.dropout", [1.0]),
           ("generations 0", "train.generations", [0]), ("unknown loss", "train.loss_type", ["ppo"]),
           ("temperature text", "train.temperature", ["hot"]), ("seed text", "seed", ["one"])]
    owner = {"adapter.rank": "rank", "seed": "seed"}  # fields an axis of VALID already sets: replace that axis
    out = [Case("bad axis value", n, _dump(with_field(f"axes.{owner.get(f, 'x')}", {"field": f, "prefix": "x", "values": v})),
                f"axes.{owner.get(f, 'x')}") for n, f, v in bad]
    out += [Case("bad axis value", "empty values", _dump(with_field("axes.rank.values", [])), "axes.rank.values"),
            Case("bad axis value", "values not a list", _dump(with_field("axes.rank.values", 4)), "axes.rank.values"),
            Case("bad axis value", "bundle without label",
                 _dump(with_field("axes.rank.values", [{"set": {"adapter.rank": 2}}])), "values[0]"),
            Case("bad axis value", "bundle with empty set", _dump(with_field("axes.rank.values", [{"label": "a", "set": {}}])),
                 "values[0]"),
            Case("bad axis value", "scalar without field", _dump(with_field("axes.rank", {"values": [1]})), "axes.rank"),
            Case("bad axis value", "one label for two different values",
                 _dump(with_field("axes.lr", {"values": [{"label": "a", "set": {"train.lr": 0.1}},
                                                    {"label": "a", "set": {"train.lr": 0.2}}]})), "share the id"),
            Case("bad axis value", "exclude unknown axis", _dump({**VALID, "exclude": [{"rnak": 1}]}), "exclude[0]"),
            Case("bad axis value", "exclude unknown label", _dump({**VALID, "exclude": [{"rank": 64}]}), "exclude[0]"),
            Case("bad axis value", "everything excluded",
                 _dump({**VALID, "exclude": [{"rank": 1}, {"rank": 2}]}), "every cell is excluded"),
            Case("bad axis value", "baseline unknown axis", _dump({**VALID, "baseline": {"lr": 1}}), "baseline"),
            Case("bad axis value", "baseline unknown label", _dump({**VALID, "baseline": {"rank": 64}}), "baseline.rank"),
            Case("bad axis value", "axes not a mapping", _dump({**VALID, "axes": [1, 2]}), "axes")]
    return out


def booleans_as_numbers() -> list[Case]:
    """`true`/`false` where a number goes (bool is an int in Python): every int/float field, and axis values."""
    out = []
    for path, ann, _default in _typed_fields():
        text = str(ann)
        if ("int" in text or "float" in text) and "bool" not in text:
            value = [True] if "list" in text or "tuple" in text else True
            out.append(Case("boolean as number", f"defaults.{path}={value!r}",
                            _dump(with_field(f"defaults.{path}", value)), f"defaults.{path}"))
    out += [Case("boolean as number", "rank axis values [true]", _dump(with_field("axes.rank.values", [True, 2])),
                 "adapter.rank"),
            Case("boolean as number", "seed axis values [false]", _dump(with_field("axes.seed.values", [False])), "seed"),
            Case("boolean as number", "bundle sets train.lr true",
                 _dump(with_field("axes.rank.values", [{"label": "x", "set": {"train.lr": True}}])), "train.lr")]
    return out


def conflicting_axes() -> list[Case]:
    out = []
    for f in ("adapter.rank", "train.lr", "seed", "train.beta"):
        d = with_field("axes.a1", {"field": f, "prefix": "a", "values": [1]})
        d = with_field("axes.a2", {"field": f, "prefix": "b", "values": [2]}, d)
        out.append(Case("conflicting axes", f"two axes set {f}", _dump(d), "both set"))
    d = with_field("axes.b", {"values": [{"label": "x", "set": {"adapter": {"rank": 4}}}]})
    out.append(Case("conflicting axes", "bundle sets a section rank also sets", _dump(d), "adapter"))
    d = with_field("axes.b", {"values": [{"label": "x", "set": {"adapter.rank": 4, "train.lr": 1}}]})
    out.append(Case("conflicting axes", "bundle overlaps the rank axis", _dump(d), "both set"))
    return out


def impossible_protocols() -> list[Case]:
    cases = [("task max<min operands", "defaults.task", {"name": "synthetic", "min_operands": 4, "max_operands": 2}),
             ("dataset without path", "defaults.task", {"name": "dataset"}),
             ("eval_every negative", "defaults.eval.eval_every", -1),
             ("prompts_per_step 0", "defaults.train.prompts_per_step", 0),
             ("init on full FT", "defaults.adapter", {"method": "full", "init": "pissa"}),
             ("mask on lora", "defaults.adapter", {"method": "lora", "mask": "principal"}),
             ("regime unknown", "defaults.reward", {"regime": "vibes"}),
             ("distillation without teacher", "defaults.reward", {"regime": "distillation"}),
             ("curve benchmark not evaluated", "defaults.eval", {"eval_every": 2, "curve_benchmarks": ["nosuch"]})]
    return [Case("impossible protocol", n, _dump(with_field(p, v)), p.split(".", 1)[1].split(".")[0]) for n, p, v in cases]


def unknown_names() -> list[Case]:
    return [Case("unknown benchmark", "eval.benchmarks nosuch",
                 _dump(with_field("defaults.eval.benchmarks", {"nosuch_bench": {}})), "nosuch_bench"),
            Case("unknown benchmark", "task name unknown", _dump(with_field("defaults.task.name", "gsm9k")), "task.name"),
            Case("unknown benchmark", "adapter method unknown", _dump(with_field("defaults.adapter.method", "lorra")),
                 "adapter"),
            Case("unknown benchmark", "adapter init unknown", _dump(with_field("defaults.adapter.init", "magic")), "init"),
            Case("unknown benchmark", "study kind unknown", _dump({**VALID, "kind": "ppo"}), "kind"),
            Case("unknown benchmark", "local recipe unknown", _dump(with_field("defaults.model", "local:no-such-recipe")),
                 "no-such-recipe")]


def missing_files() -> list[Case]:
    return [Case("missing file", "model path", _dump(with_field("defaults.model", "/nonexistent/model/dir")), "model"),
            Case("missing file", "relative model path", _dump(with_field("defaults.model", "./no/such/model")), "model"),
            Case("missing file", "teacher path",
                 _dump(with_field("defaults.reward", {"regime": "distillation", "teacher": "/nonexistent/teacher"})),
                 "teacher"),
            Case("missing file", "dataset path",
                 _dump(with_field("defaults.eval.benchmarks", ["gsm8k"],
                             with_field("defaults.task", {"name": "dataset", "path": "/nonexistent/data.jsonl"}))),
                 "task.path"),
            Case("impossible protocol", "dataset task without benchmarks",
                 _dump(with_field("defaults.task", {"name": "dataset", "path": "/nonexistent/data.jsonl"})),
                 "eval.benchmarks"),
            Case("missing file", "study file itself", "", "no such study file")]


def yaml_errors() -> list[Case]:
    good = _dump(VALID)
    lines = good.splitlines()
    out = [Case("YAML syntax", "unclosed bracket", good.replace("values:\n", "values: [1, 2\n", 1), "line"),
           Case("YAML syntax", "tab indentation", good.replace("  model:", "\tmodel:", 1), "line"),
           Case("YAML syntax", "bad indentation", good.replace("  task:", "    task:", 1).replace("  adapter:", " adapter:", 1),
                "line"),
           Case("YAML syntax", "unclosed quote", good.replace("name: bad", "name: 'bad", 1), "line"),
           Case("YAML syntax", "duplicate key", good + "name: again\n", "line"),
           Case("YAML syntax", "duplicate nested key", good.replace("  train:\n", "  train:\n    steps: 9\n", 1), "line"),
           Case("YAML syntax", "a list, not a mapping", "- name: bad\n", "mapping"),
           Case("YAML syntax", "a scalar", "just text\n", "mapping"),
           Case("YAML syntax", "empty file", "\n", "mapping"),
           Case("YAML syntax", "stray colon", "\n".join(lines[:3] + ["  : oops"] + lines[3:]) + "\n", "line"),
           Case("YAML syntax", "anchor missing", good.replace("lr: 0.001", "lr: *nolr", 1), "line")]
    return out


UNSAFE = ["../escape", "a/b", "/abs", "..", ".", "", "x y", "a\\b", "~home", "-dash", "name\nnewline", "ünï"]


def unsafe_names() -> list[Case]:
    out = [Case("unsafe name", f"study name {n!r}", _dump({**VALID, "name": n}), "name") for n in UNSAFE]
    for n in ("../x", "a/b", "x y", "", "a.b"):
        d = copy.deepcopy(VALID)
        d["axes"][n] = {"field": "train.lr", "values": [0.1]}
        out.append(Case("unsafe name", f"axis name {n!r}", _dump(d), "axis name"))
    return out


def cases() -> list[Case]:
    from lorarl.badstudies_size import too_large

    return (wrong_types() + unknown_fields() + bad_axis_values() + booleans_as_numbers() + conflicting_axes() + impossible_protocols()
            + unknown_names() + missing_files() + yaml_errors() + unsafe_names() + too_large(VALID, Case))


@dataclass
class Result:
    case: Case
    rc: int
    message: str
    written: list[str]

    @property
    def problems(self) -> list[str]:
        out = []
        if self.rc != 2:
            out.append(f"exit status {self.rc}, not 2")
        if "Traceback" in self.message:
            out.append("a traceback")
        if self.written:
            out.append(f"wrote {', '.join(self.written[:3])}")
        if "study.yaml" not in self.message:
            out.append("the message does not name the file")
        if self.case.place.lower() not in self.message.lower():
            out.append(f"the message does not name the place ({self.case.place!r})")
        if not ALLOWED.search(self.message):
            out.append("the message does not say what is allowed")
        return out


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def check(case: Case, scratch: Path, run: Callable[[list[str]], int] | None = None) -> Result:
    """`lorarl cells <scratch>/study.yaml` from inside `scratch`; what it printed and wrote."""
    from lorarl import cli

    run = run or cli.main
    scratch.mkdir(parents=True, exist_ok=True)
    study = scratch / "study.yaml"
    if case.category != "missing file" or case.name != "study file itself":
        study.write_text(case.text)
    before = _files(scratch)
    out, err = io.StringIO(), io.StringIO()
    cwd = Path.cwd()
    try:
        import os

        os.chdir(scratch)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = run(["cells", str(study)])
            except SystemExit as stop:
                rc = stop.code if isinstance(stop.code, int) else 1
            except Exception:  # noqa: BLE001 - a crash is a finding, shown as such
                import traceback

                traceback.print_exc()
                rc = 1
    finally:
        os.chdir(cwd)
    written = sorted(_files(scratch) - before)
    return Result(case, rc, err.getvalue() + out.getvalue(), written)


def id_escapes() -> list[str]:
    """Valid studies whose labels and prefixes are hostile: every cell id and derived path must stay
    inside results/<study>/ (or the study is refused). Returns the escapes found (none expected)."""
    from lorarl import paths
    from lorarl.language.matrix import StudyError
    from lorarl.language.study import base_cells, parse_study, study_cells

    hostile = ["../../etc", "/abs", "a/../../b", "..", "x\\..\\y", "~", "$(rm)", "a b", "\x00nul"]
    found = []
    results = Path("/r/results").resolve()
    for i, h in enumerate(hostile):
        d = with_field("axes.h", {"prefix": h, "values": [{"label": h, "set": {"train.lr": 0.001 * (i + 1)}}]})
        try:
            study = parse_study(d)
            ids = [c.id for c in study_cells(study)] + [b.id for b in base_cells(study)]
        except StudyError:
            continue  # refused: fine
        for cid in ids:
            p = paths.cell_dir(results, study.name, cid)
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", cid) or ".." in cid.split(".") or \
                    Path(p).resolve().parent != results / study.name:
                found.append(f"label {h!r} -> id {cid!r}")
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m lorarl.badstudies", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="print every message")
    args = p.parse_args(argv)
    all_cases = cases()
    by_cat: dict[str, list[Result]] = {}
    with tempfile.TemporaryDirectory(prefix="lorarl-bad-") as tmp:
        for i, c in enumerate(all_cases):
            r = check(c, Path(tmp) / f"case-{i}")
            by_cat.setdefault(c.category, []).append(r)
            if args.verbose or r.problems:
                print(f"[{c.category}] {c.name}: rc {r.rc}" + (f" PROBLEMS: {r.problems}" if r.problems else ""))
                print("    " + r.message.strip().replace("\n", "\n    ")[:600])
    escapes = id_escapes()
    print("\n| category | studies | exit 2 | names file + place + allowed | nothing written |")
    print("|---|---|---|---|---|")
    tot = [0, 0, 0, 0]
    for cat, rs in by_cat.items():
        row = [len(rs), sum(r.rc == 2 for r in rs), sum(not r.problems for r in rs), sum(not r.written for r in rs)]
        tot = [a + b for a, b in zip(tot, row)]
        print(f"| {cat} | " + " | ".join(map(str, row)) + " |")
    print("| **all** | " + " | ".join(map(str, tot)) + " |")
    print(f"\nhostile labels/prefixes whose cell ids could leave results/: {len(escapes)}"
          + (": " + "; ".join(escapes) if escapes else ""))
    return 0 if tot[0] == tot[2] and not escapes else 1


if __name__ == "__main__":
    sys.exit(main())
