"""The documentation stays whole: every relative link in README.md, docs/*.md and the measurement logs
bench/results/*.md resolves (the file, and the #anchor to a heading of it, GitHub's slugs), every `lorarl`
subcommand (read from the CLI parser's help) and every config section (the top-level fields of the study and
cell config models) is documented on some page (README.md or docs/), and docs/studies.md's field tables list the
values each `Literal` field accepts."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LOGS = sorted((REPO / "bench" / "results").glob("*.md"))  # measurement logs the pages link to (their latest figure)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            code = not code
        elif not code:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return out


def links(page: Path) -> list[str]:
    return [t for line in _prose(page.read_text()) for t in LINK.findall(re.sub(r"`[^`]*`", "", line))]


def test_the_pages_exist():
    names = {p.name for p in PAGES}
    assert {"README.md", "studies.md", "slurm.md", "gpus.md", "evaluation.md", "report.md", "packed.md",
            "reliability.md", "benchmarks.md", "tracking.md", "contributing.md"} <= names
    assert {"gpucheck-h200.md", "doctor-projection.md", "ci-time.md"} <= {p.name for p in LOGS}


@pytest.mark.parametrize("page", PAGES + LOGS, ids=[str(p.relative_to(REPO)) for p in PAGES + LOGS])
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_checker_sees_a_broken_link_and_anchor(tmp_path: Path):
    (tmp_path / "a.md").write_text("# Top\n## The `store`: sqlite\n[x](b.md#nowhere) [y](#the-store-sqlite)\n"
                                   "```\n[not a link](gone.md)\n```\n")
    assert anchors(tmp_path / "a.md") == {"top", "the-store-sqlite"}
    assert links(tmp_path / "a.md") == ["b.md#nowhere", "#the-store-sqlite"]


def _help(argv: list[str]) -> str:
    from lorarl import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(argv)
    return out.getvalue()


def subcommands() -> list[str]:
    """`cells`, `run`, ..., and nested ones as `tracking serve`, from the parser's own help."""
    out = []
    sub = re.compile(r"\{([^}]*)\}\s+\.\.\.")  # a subparser's usage: `{a,b} ...` (a choice has no `...`)
    for name in sub.search(_help(["--help"])).group(1).split(","):
        nested = sub.search(_help([name, "--help"]))
        out += [f"{name} {sub}" for sub in nested.group(1).split(",")] if nested else [name]
    return out


def test_every_subcommand_is_documented():
    text = "\n".join(p.read_text() for p in PAGES)
    cmds = subcommands()
    assert len(cmds) >= 10 and "cells" in cmds and "tracking serve" in cmds
    missing = [c for c in cmds if f"lorarl {c}" not in text]
    assert not missing, f"undocumented `lorarl` subcommands: {missing}"


def config_sections() -> list[str]:
    """Top-level fields of a study (name, defaults, axes, ...) and of a cell's config (task, adapter,
    train, ...; the toy study's cell config too)."""
    from lorarl.language.config import CellConfig
    from lorarl.language.study import Study
    from lorarl.language.toy import ToyCellConfig

    return list(dict.fromkeys([*Study.model_fields, *CellConfig.model_fields, *ToyCellConfig.model_fields]))


def test_every_config_section_is_documented():
    text = "\n".join(p.read_text() for p in PAGES)
    sections = config_sections()
    assert {"axes", "defaults", "adapter", "train", "eval", "reward", "toy"} <= set(sections)
    missing = [s for s in sections if not re.search(rf"(`{s}[`:.\s]|^\s*{s}:)", text, re.M)]
    assert not missing, f"config sections documented on no page: {missing}"


def test_the_pages_show_the_recovery_commands_the_fault_driver_runs():
    """docs/slurm.md and docs/reliability.md tell a user the very commands (lorarl.pipeline.drills.recovery) that the
    fault driver and tests/pipeline/test_faults.py recover with, word for word: the two cannot drift apart."""
    from lorarl.pipeline.drills import faults, recovery

    assert (faults.UNLOCK, faults.RUN) == recovery.COMMANDS["local"]
    for page in recovery.PAGES:
        text = (REPO / page).read_text()
        for command in (recovery.shown(c) for pair in recovery.COMMANDS.values() for c in pair):
            shown = f"`{command}`" in text or re.search(rf"^{re.escape(command)}(\s|$)", text, re.M)
            assert shown, f"{page} does not show `{command}` (lorarl.pipeline.drills.recovery.COMMANDS)"


def _config_literals() -> dict[str, set[tuple]]:
    """Every ``Literal[...]`` a config field of that name is typed with: the study, the cell config (every nested
    section) and every reward regime's section."""
    import typing

    from pydantic import BaseModel

    from lorarl.language.config import CellConfig
    from lorarl.language.study import Study
    from lorarl.language.toy import ToyCellConfig
    from lorarl.rewards.registry import sections

    def literals(tp: object) -> list[tuple]:
        if typing.get_origin(tp) is typing.Literal:
            return [typing.get_args(tp)]
        return [lit for arg in typing.get_args(tp) for lit in literals(arg)]

    def walk(tp: object, seen: set) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel) and tp not in seen:
            seen.add(tp)
            for field in tp.model_fields.values():
                walk(field.annotation, seen)
        for arg in typing.get_args(tp):
            walk(arg, seen)

    seen: set = set()
    for model in (Study, CellConfig, ToyCellConfig, *sections()):
        walk(model, seen)
    out: dict[str, set[tuple]] = {}
    for model in seen:
        for name, field in model.model_fields.items():
            out.setdefault(name, set()).update(literals(field.annotation))
    return out


def test_the_field_tables_list_each_fields_allowed_values():
    """A field table row of docs/studies.md typed ``Literal[...]`` lists the values the config accepts (an answer
    format added to the config and not to the table, hendrycks_boxed, was missing from both answer_format rows)."""
    typed = _config_literals()
    row = re.compile(r"^\| `(\w+)` \| `(.*?)` \|")
    rows = [(m.group(1), m.group(2)) for line in (REPO / "docs" / "studies.md").read_text().splitlines()
            if (m := row.match(line)) and "Literal[" in m.group(2)]
    assert len(rows) >= 20 and ("backend", 'Literal["auto", "hf", "vllm"]') in rows
    wrong = [(name, lit) for name, cell in rows for lit in re.findall(r"Literal\[([^\]]*)\]", cell)
             if tuple(re.findall(r'"([^"]*)"', lit)) not in typed.get(name, set())]
    assert not wrong, f"docs/studies.md rows whose Literal is not the config's: {wrong}"


def test_the_graders_table_has_a_row_per_answer_format():
    """docs/evaluation.md's graders per format: one row per answer format the config accepts, and the multiple-choice
    column reads an answer span exactly for the span formats (lorarl.grading.answer_formats.SPANS)."""
    from lorarl.grading.answer_formats import ANSWER_FORMATS, SPANS

    lines = (REPO / "docs" / "evaluation.md").read_text().splitlines()
    start = lines.index("### Graders per format")
    rows = {}
    for line in lines[start:]:
        m = re.match(r"^\| `(\w+)` \| (.*) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(3)
        elif rows and not line.startswith("|"):
            break
    assert tuple(rows) == ANSWER_FORMATS
    reads_span = {f for f, mc in rows.items() if "inside `<answer>`" in mc or mc == "as `xml_answer`"}
    assert reads_span == set(SPANS)
