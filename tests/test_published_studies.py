"""Every published study (experiments/*.yaml except the CPU twins and the demo) begins with a
fidelity table against its paper and still expands into cells; every CPU twin names its study."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lorarl.study import load_study, study_cells

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
PUBLISHED = sorted(p for p in EXPERIMENTS.glob("*.yaml")
                   if not p.stem.endswith("_cpu") and p.stem != "demo")
TWINS = sorted(EXPERIMENTS.glob("*_cpu.yaml"))
HEADER = ("setting", "paper (section/table)", "this file", "note")
# The settings every fidelity table covers (the list); extra rows are welcome.
REQUIRED = ("model", "data", "prompt", "reward", "loss", "clip", "kl", "advantage", "lr and schedule",
            "batch", "lengths", "sampling", "steps", "adapter settings", "seeds", "evaluation")


def fidelity_table(path: Path) -> dict[str, list[str]]:
    """The leading comment block's `| setting | paper (section/table) | this file | note |` table:
    setting (lower case) -> its three other cells. Raises if the block or the header is missing."""
    lines = path.read_text().splitlines()
    block = []
    for line in lines:
        if not line.startswith("#"):
            break
        block.append(line[1:].strip())
    header = None
    for i, line in enumerate(block):
        cells = [c.strip().lower() for c in line.strip("|").split("|")]
        if line.startswith("|") and tuple(cells) == HEADER:
            header = i
            break
    if header is None:
        raise AssertionError(f"{path.name}: no fidelity table header {' | '.join(HEADER)} in the leading comments")
    rows: dict[str, list[str]] = {}
    for line in block[header + 1:]:
        if not line.startswith("|"):
            break
        if re.fullmatch(r"\|(\s*-+\s*\|)+", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].lower()] = cells[1:]
    return rows


def test_published_studies_exist():
    names = {p.stem for p in PUBLISHED}
    assert {"kl_free", "kl_bound_toy", "reward_density", "peft_zoo", "init_geometry"} <= names
    assert len(PUBLISHED) >= 9  # plus the studies added for papers 000, 002, 003 and 004


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_published_study_has_fidelity_table_and_expands(path):
    rows = fidelity_table(path)
    missing = [r for r in REQUIRED if r not in rows]
    assert not missing, f"{path.name}: fidelity table lacks rows {missing}"
    for name, cells in rows.items():
        assert len(cells) == 3 and all(cells), f"{path.name}: row {name!r} needs paper | this file | note"
    assert re.search(r"paper 00[0-4]", path.read_text()[:600]), f"{path.name}: name its paper (paper 00N)"
    cells = study_cells(load_study(path))
    assert cells and len({c.id for c in cells}) == len(cells)


def test_fidelity_table_parser_rejects_incomplete_tables(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# paper 000\n# | setting | paper (section/table) | this file | note |\n# |---|---|---|---|\n"
                   "# | model | §5 | x | y |\nname: bad\n")
    rows = fidelity_table(bad)
    assert list(rows) == ["model"] and [r for r in REQUIRED if r not in rows]
    (tmp_path / "none.yaml").write_text("# nothing here\nname: none\n")
    with pytest.raises(AssertionError, match="no fidelity table"):
        fidelity_table(tmp_path / "none.yaml")


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.stem)
def test_cpu_twin_names_its_published_study(path):
    study = EXPERIMENTS / f"{path.stem[:-4]}.yaml"
    assert study.exists(), f"{path.name} has no published study {study.name}"
    assert study.name in path.read_text()[:800]
