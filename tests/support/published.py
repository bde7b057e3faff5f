"""The published studies and their fidelity tables, shared by the tests that check them (one support module: no
test module imports another)."""

from __future__ import annotations

import re
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
PUBLISHED = sorted(p for p in EXPERIMENTS.glob("*.yaml")
                   if not p.stem.endswith("_cpu") and p.stem not in ("demo", "demo_adaptive"))
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
