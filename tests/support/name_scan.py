"""A registry's names compared outside the package that owns the registry (tests/project/test_structure.py): the
facts of a registered thing live in its entry, never in an `if name == ...` elsewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

NAME_SCANNED = ("lorarl", "workflow", "scripts", "bench", "Snakefile")  # the code that runs or measures a study (tests name regimes)


def _compares_name(node: ast.AST, names: set[str]) -> bool:
    """A comparison with a string constant in ``names``: `x == "outcome"`, `x in ("process", ...)`."""
    if not isinstance(node, ast.Compare):
        return False
    for side in [node.left, *node.comparators]:
        if isinstance(side, ast.Constant) and side.value in names:
            return True
        if isinstance(side, (ast.Tuple, ast.List, ast.Set)) and any(
                isinstance(e, ast.Constant) and e.value in names for e in side.elts):
            return True
    return False


def name_tests(root: Path, names: set[str], owner: str = "lorarl/rewards") -> list[str]:
    """`file:line` of every comparison with one of ``names`` outside ``owner``; Snakemake files (no Python
    grammar) by a pattern of the same comparisons."""
    alt = "|".join(re.escape(n) for n in sorted(names))
    smk = re.compile(rf"""(==|!=)\s*["']({alt})["']|["']({alt})["']\s*(==|!=|\bin\b)|\bin\s*[(\[{{][^)\]}}]*["']({alt})["']""")
    out = []
    for top in NAME_SCANNED:
        base = root / top
        for f in [base] if base.is_file() else sorted(base.rglob("*")):
            rel = str(f.relative_to(root))
            if rel.startswith(owner + "/") or "__pycache__" in f.parts:
                continue
            text = f.read_text() if f.suffix == ".py" or f.suffix == ".smk" or f.name == "Snakefile" else ""
            if not any(f"{q}{n}{q}" in text for n in names for q in "'\""):  # no quoted name: nothing to parse
                continue
            if f.suffix == ".py":
                tree = ast.parse(text, rel)
                out += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if _compares_name(n, names)]
            elif f.suffix == ".smk" or f.name == "Snakefile":
                out += [f"{rel}:{i}" for i, line in enumerate(text.splitlines(), 1) if smk.search(line)]
    return sorted(set(out))


def name_branches(root: Path, subject: str, names: set[str], skip: tuple[str, ...] = ()) -> list[str]:
    """file:line of each comparison of `subject` (or `x.subject`) with one of ``names``, or its membership in a
    literal naming one, in lorarl/ and workflow/ (the .smk rules and the Snakefile by their text), ``skip`` excepted."""
    def is_subject(n: ast.AST) -> bool:
        return (isinstance(n, ast.Name) and n.id == subject) or (isinstance(n, ast.Attribute) and n.attr == subject)

    def names_one(n: ast.AST) -> bool:
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(names_one(e) for e in n.elts)
        return isinstance(n, ast.Constant) and n.value in names

    smk = re.compile(rf"""\b{subject}\s*(?:==|!=)\s*["'](\w+)["']|["'](\w+)["']\s*(?:==|!=)\s*(?:\w+\.)?{subject}\b""")
    out = []
    for path in sorted([*(root / "lorarl").rglob("*.py"), *(root / "workflow").rglob("*.smk"), root / "Snakefile"]):
        rel = str(path.relative_to(root))
        if rel in skip or not path.is_file():
            continue
        if path.suffix != ".py":  # Snakemake syntax: its text
            out += [f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                    if any(n in names for m in smk.finditer(line) for n in m.groups())]
            continue
        out += [f"{rel}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text(), rel)) if isinstance(n, ast.Compare)
                and any(map(is_subject, [n.left, *n.comparators])) and any(map(names_one, [n.left, *n.comparators]))]
    return out
