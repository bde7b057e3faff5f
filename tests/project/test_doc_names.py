"""Every dotted `lorarl.x.y` name the docs (README.md, docs/, the measurement logs bench/results/*.md) and the
package's docstrings mention resolves to a module, class, function or attribute of the package, and every
`tests/....py` path the docs name exists: a name
that moved is caught here, not by a reader. Names whose first part is not a module of the package (MLflow tags
such as `lorarl.state`, file names such as `lorarl.json`, the placeholder `lorarl.x`) are not code names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\blorarl(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
TEST_PATH = re.compile(r"\btests/[A-Za-z0-9_/]+\.py\b")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "bench" / "results").glob("*.md"))]


def _docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return "\n".join(d for n in nodes if (d := ast.get_docstring(n)))


def _code_names() -> dict[str, str]:
    """name -> where it was first seen, for names whose first part is a module or package of lorarl."""
    texts = {str(p.relative_to(REPO)): p.read_text() for p in DOCS}
    texts |= {str(p.relative_to(REPO)): _docstrings(p) for p in sorted((REPO / "lorarl").rglob("*.py"))}
    out: dict[str, str] = {}
    for where, text in texts.items():
        for m in NAME.finditer(text):
            first = m.group(0).split(".")[1]
            if (REPO / "lorarl" / f"{first}.py").exists() or (REPO / "lorarl" / first).is_dir():
                out.setdefault(m.group(0).rstrip("."), where)
    return out


def _module(parts: list[str]) -> Path | None:
    """The file of module lorarl.<parts> (a package's __init__.py), or None."""
    base = REPO.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names bound at the top of a module or class body: defs, classes, assignments and imports."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            out |= _defined(node.body)
    lazy = out.get("_LAZY")  # a package's lazily imported names (its module __getattr__ reads _LAZY)
    if isinstance(lazy, ast.Assign) and isinstance(lazy.value, ast.Dict):
        out |= {k.value: lazy for k in lazy.value.keys if isinstance(k, ast.Constant)}
    return out


def _resolves(name: str) -> bool:
    """Statically (nothing imported): the longest module prefix, then names bound in its body and in the bodies
    of the classes they name."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        path = _module(parts[:i])
        if path is None:
            continue
        scope = _defined(ast.parse(path.read_text()).body)
        for attr in parts[i:]:
            node = scope.get(attr)
            if node is None:
                return False
            scope = _defined(node.body) if isinstance(node, ast.ClassDef) else {}
        return True
    return False


def test_every_dotted_name_resolves():
    names = _code_names()
    assert len(names) > 150  # the docs name much of the package: the scan itself works
    stale = [f"{where}: {name}" for name, where in sorted(names.items()) if not _resolves(name)]
    assert not stale, "names that do not resolve (moved or renamed?):\n" + "\n".join(stale)


def test_a_moved_name_is_caught():
    assert _resolves("lorarl.report.stats.two_level") and _resolves("lorarl.language.config.TrainConfig")
    assert not _resolves("lorarl.pipeline.jobs.launch.local_gpus") and not _resolves("lorarl.train.dist")


def test_every_test_path_in_the_docs_exists():
    missing = [(p.name, m.group(0)) for p in DOCS for m in TEST_PATH.finditer(p.read_text())
               if not (REPO / m.group(0)).exists()]
    assert not missing, missing
