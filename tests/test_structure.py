"""The house rules, checked statically: no import cycles in lorarl, no module over 400 lines, and a
README Layout section that names every package.

The import graph counts every import of a lorarl module: at module level, inside functions (a
function-level import that only dodges a cycle is still a cycle) and under `if TYPE_CHECKING:`.
The last ones never execute, but they are the back edge that lets a function-level import close a
circle unseen (config -> evaluate.plan in a validator, plan -> config for its annotations): the
modules still depend on each other both ways. Lazy imports for light start-up are fine as long as
they do not close a cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400  # the house limit for one module (source, tests, benchmarks, rules)
CHECKED_DIRS = ("lorarl", "workflow", "tests", "bench")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in the module (functions and `if TYPE_CHECKING:` included)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph(root: Path, package: str = "lorarl") -> dict[str, set[str]]:
    """module -> the lorarl modules it imports (a `from pkg import name` counts as pkg.name when that
    is a module, else as pkg)."""
    files = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
                continue
            base = node.module or ""
            if node.level:  # relative import
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                deps.add(sub if sub in files else base)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _edges_within(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    return [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]


def test_lorarl_has_no_import_cycle():
    graph = import_graph(REPO)
    assert len(graph) > 50 and "lorarl.train.main" in graph  # the scan found the package
    found = cycles(graph)
    assert not found, "import cycles (break them; never by a function-level import):\n" + "\n".join(
        "; ".join(_edges_within(graph, c)) for c in found)


def test_cycle_finder_finds_a_function_level_cycle(tmp_path: Path):
    """The checker itself: a cycle closed only inside a function is still reported, and so is one whose
    back edge is an annotation-only (`if TYPE_CHECKING:`) import."""
    pkg = tmp_path / "lorarl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from lorarl.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from lorarl import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lorarl import a\n")
    (pkg / "d.py").write_text("from . import c\n")
    graph = import_graph(tmp_path)
    assert graph["lorarl.a"] == {"lorarl.sub.b"} and graph["lorarl.sub.b"] == {"lorarl.a"}
    assert graph["lorarl.c"] == {"lorarl.a"} and graph["lorarl.d"] == {"lorarl.c"}
    assert cycles(graph) == [["lorarl.a", "lorarl.sub.b"]]
    (pkg / "a.py").write_text("from lorarl.sub import b\ndef g():\n    from lorarl import d\n")  # a -> d -> c -> a
    assert cycles(import_graph(tmp_path)) == [["lorarl.a", "lorarl.c", "lorarl.d", "lorarl.sub.b"]]


def _checked_files() -> list[Path]:
    out = []
    for d in CHECKED_DIRS:
        out += [p for p in (REPO / d).rglob("*") if p.is_file() and p.suffix in {".py", ".smk"}
                and "__pycache__" not in p.parts]
    return sorted(out)


def test_no_module_over_400_lines():
    files = _checked_files()
    assert any(p.name == "Snakefile" or p.suffix == ".smk" for p in files)
    too_long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by responsibility): {too_long}"


def _layout_section() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert m, "README.md has no `## Layout` section"
    return m.group(1)


def test_readme_layout_names_every_package():
    layout = _layout_section()
    packages = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "lorarl").rglob("__init__.py")
                      if "__pycache__" not in p.parts)
    assert "lorarl/train" in packages and "lorarl/pipeline" in packages
    missing = [p for p in packages if f"{p}/" not in layout]
    assert not missing, f"README Layout does not name these packages: {missing}"


LOWER_THAN_TRAIN = ("lorarl.memory", "lorarl.pipeline")  # the floors above the trainer: planners, launchers


def test_train_reaches_nothing_above_it():
    """The trainer receives a resolved config (auto knobs, devices, ranks resolved where the job starts)
    and never reaches up: no lorarl.train module imports lorarl.memory or lorarl.pipeline, directly or
    through the modules it imports."""
    graph = import_graph(REPO)
    parent: dict[str, str] = {}
    stack = [m for m in graph if m.startswith("lorarl.train")]
    assert "lorarl.train.main" in stack
    while stack:
        v = stack.pop()
        for w in graph[v]:
            if w not in parent and not w.startswith("lorarl.train"):
                parent[w] = v
                stack.append(w)
    walks = []
    for w in sorted(parent):
        if w.startswith(LOWER_THAN_TRAIN):
            path = [w]
            while not path[-1].startswith("lorarl.train"):
                path.append(parent[path[-1]])
            walks.append(" <- ".join(path))
    assert not walks, "lorarl.train reaches up (hand it a resolved config instead):\n" + "\n".join(walks)
