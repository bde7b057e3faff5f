"""Imports, in tests/, of a test module (tests/project/test_structure.py): what two test modules share lives in
tests/support/, so no test module imports another (a test module imported elsewhere runs its tests' imports
and fixtures twice and ties the two modules' bodies together)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def defines_tests(path: Path) -> bool:
    """A `test_*.py` file, or a module with a top-level `test*` function or `Test*` class (pytest would collect it)."""
    if path.name.startswith("test_"):
        return True
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
               or isinstance(n, ast.ClassDef) and n.name.startswith("Test") for n in tree.body)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import may load: `import a.b` -> a.b; `from a import b` -> a, a.b."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    return [base, *(f"{base}.{a.name}" if base else a.name for a in node.names)]


def imports_of_test_modules(tests_dir: Path) -> list[str]:
    """`file:line: name` of every import (module level or in a function), in ``tests_dir``, of a module there
    that defines tests; names resolve from ``tests_dir``'s parent (`tests.x.y`) or, bare (`import x`, the
    directory pytest puts on sys.path), from ``tests_dir`` and the importer's own directory."""
    root, found = tests_dir.parent, []
    files = set(tests_dir.rglob("*.py"))
    for path in sorted(files):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                continue
            for name in _imported(node):
                rel = Path(*name.split(".")).with_suffix(".py")
                hits = [p for p in (root / rel, tests_dir / rel, path.parent / rel) if p in files]
                if hits and defines_tests(hits[0]):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found
