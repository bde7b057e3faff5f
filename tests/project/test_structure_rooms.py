"""House rules on where names live (tests/project/test_structure.py holds the import layers): the code names only the
environment variables of docs/contributing.md's table; no module re-exports another's names behind `# noqa: F401`
(an importer imports a name from its home); and the study language lives in one package, lorarl/language/, with no
module of it left at the top of lorarl/, and every model of it on one strict base."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
# the study language's modules as they were once named at the top of lorarl/ (and in lorarl/adaptive/), and their home now
STUDY_LANGUAGE = {
    "config": "language/config.py", "taskconfig": "language/task.py", "prompt_config": "language/prompt.py",
    "toyconfig": "language/toy.py", "signature": "language/signature.py",
    "reserved": "language/reserved.py", "kinds": "language/kinds.py", "matrix": "language/matrix.py", "yamlpos": "language/yamlpos.py",
    "preflight": "language/preflight.py", "hubcheck": "language/hubcheck.py", "study": "language/study.py",
    "profiles": "language/profiles.py", "evalplan": "language/evalplan/plan.py", "adaptive/spec": "language/adaptive/blocks.py",
    "adaptive/seeds": "language/adaptive/seeds.py", "adaptive/settings": "language/adaptive/settings.py",
}


def _is_module(root: Path, dotted: str) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def reexports(root: Path) -> list[str]:
    """`file:line name` for every name a `from x import name  # noqa: F401` brings into a lorarl module without
    using it, unless that name is a lorarl module imported for its side effect (a registry filling itself)."""
    out = []
    for path in sorted((root / "lorarl").rglob("*.py")):
        text = path.read_text()
        if "noqa: F401" not in text:
            continue
        lines = text.splitlines()
        tree = ast.parse(text, str(path))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not any(
                    "noqa: F401" in line for line in lines[node.lineno - 1:node.end_lineno]):
                continue
            for a in node.names:
                if (a.asname or a.name) not in used and not _is_module(root, f"{node.module}.{a.name}"):
                    out.append(f"{path.relative_to(root)}:{node.lineno} {a.name}")
    return out


def test_no_name_is_reexported_behind_noqa():
    found = reexports(REPO)
    assert not found, ("names re-exported behind `# noqa: F401` (import them from their home module and drop "
                       "the re-export):\n" + "\n".join(found))


def test_the_reexport_scan_sees_a_reexport_and_spares_a_side_effect_import(tmp_path: Path):
    pkg = tmp_path / "lorarl"
    (pkg / "adapters" / "methods").mkdir(parents=True)
    for f in ("__init__.py", "adapters/__init__.py", "adapters/methods/__init__.py", "io.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("import math_verify  # noqa: F401 - paid at start\n"
                              "from lorarl.adapters import methods  # noqa: F401 (registers them)\n"
                              "from lorarl.io import (atomic_write, pid_alive,  # noqa: F401\n    read)\n"
                              "from lorarl.io import used, kept  # noqa: F401\nused()\n")
    assert reexports(tmp_path) == ["lorarl/a.py:3 atomic_write", "lorarl/a.py:3 pid_alive", "lorarl/a.py:3 read",
                                   "lorarl/a.py:5 kept"]


def test_the_study_language_lives_in_lorarl_language():
    left = [old for old in STUDY_LANGUAGE if (REPO / "lorarl" / f"{old}.py").exists() or (REPO / "lorarl" / old).is_dir()]
    assert not left, f"study-language modules outside lorarl/language/ (move them there): {left}"
    missing = [new for new in STUDY_LANGUAGE.values() if not (REPO / "lorarl" / new).is_file()]
    assert not missing, f"lorarl/language/ lacks {missing}: update STUDY_LANGUAGE with where they went"


def test_every_model_of_the_study_language_stands_on_the_one_strict_base():
    from lorarl.strict import Strict

    names = [".".join(p.relative_to(REPO).with_suffix("").parts) for p in sorted((REPO / "lorarl" / "language").rglob("*.py"))
             if p.name != "__init__.py"]
    models = {f"{m}.{k}": v for m in names for k, v in vars(importlib.import_module(m)).items()
              if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == m}
    assert {"lorarl.language.config.CellConfig", "lorarl.language.study.Study", "lorarl.language.matrix.Axis"} <= set(models)
    loose = sorted(k for k, v in models.items() if not issubclass(v, Strict))
    assert not loose, f"study-language models not on lorarl.strict.Strict (unknown fields, booleans as numbers): {loose}"


ENV_NAME = re.compile(r"\bLORARL_[A-Z][A-Z0-9_]*")
ENV_SCANNED = ("lorarl", "workflow", "scripts", "Snakefile")  # the code that runs a study (tests and bench set them)


def env_table(text: str) -> set[str]:
    """The variables the table of docs/contributing.md lists (its section: job parameters and environment)."""
    section = text.split("## Job parameters and environment variables", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(LORARL_[A-Z0-9_]+)` \|", section, re.M))


def env_named(root: Path) -> dict[str, list[str]]:
    """variable -> the files under ``root`` (ENV_SCANNED) that name it."""
    out: dict[str, list[str]] = {}
    for top in ENV_SCANNED:
        base = root / top
        for f in ([base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())):
            if f.suffix in (".pyc",) or "__pycache__" in f.parts:
                continue
            for name in set(ENV_NAME.findall(f.read_text(errors="replace"))):
                out.setdefault(name, []).append(str(f.relative_to(root)))
    return out


def test_the_code_names_only_the_environment_variables_of_the_table():
    """No job parameter travels in the environment: a LORARL_* variable the code names is a user knob, a test hook
    or the job's own, listed in docs/contributing.md; and the table lists none the code no longer names."""
    named = env_named(REPO)
    listed = env_table((REPO / "docs" / "contributing.md").read_text())
    assert {"LORARL_TRACKING", "LORARL_FAULT"} <= listed  # the table was found
    unlisted = {k: v for k, v in named.items() if k not in listed}
    assert not unlisted, f"LORARL_* variables not in docs/contributing.md's table: {unlisted}"
    assert not listed - set(named), f"listed in docs/contributing.md but named nowhere: {sorted(listed - set(named))}"


def test_the_environment_scan_sees_a_new_variable(tmp_path: Path):
    (tmp_path / "lorarl").mkdir()
    (tmp_path / "workflow").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "Snakefile").write_text('shell: "LORARL_TRAIN_UNTIL={wildcards.step} lorarl launch"\n')
    (tmp_path / "lorarl" / "m.py").write_text('X = os.environ.get("LORARL_PACK_PLACES")  # see ``LORARL_*``\n')
    assert env_named(tmp_path) == {"LORARL_TRAIN_UNTIL": ["Snakefile"], "LORARL_PACK_PLACES": ["lorarl/m.py"]}
    table = "## Job parameters and environment variables\n\n| `LORARL_FAULT` | hooks | unset | test hook |\n\n## Tests\n" \
            "| `LORARL_OTHER` | x | y | z |\n"
    assert env_table(table) == {"LORARL_FAULT"}
