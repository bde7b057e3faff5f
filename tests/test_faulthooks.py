"""Every LORARL_FAULT test hook is named and parsed in lorarl.faulthooks: a table of values, what each reader
gets, and a scan that no other module of the code that runs a study reads the variable itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lorarl import faulthooks
from lorarl.faulthooks import FAULT_ENV, HOOKS, Fault, parse

REPO = Path(__file__).resolve().parents[1]
ALLOWED = ("allowed: kill_at_step:N, kill_after_save:N, nan_reward_at_step:N, flat_prompts:N, oom_above:N, "
           "oom_ranks_below:N, step_delay_ms:N, disk_full")

CASES = [  # (LORARL_FAULT value, the parsed hook or the error's text)
    ("", None),
    ("kill_at_step:3", Fault("kill_at_step", 3)),
    ("kill_after_save:2", Fault("kill_after_save", 2)),
    ("nan_reward_at_step:1", Fault("nan_reward_at_step", 1)),
    ("flat_prompts:2", Fault("flat_prompts", 2)),
    ("oom_above:0", Fault("oom_above", 0)),  # every micro-batch runs out of memory
    ("oom_ranks_below:2", Fault("oom_ranks_below", 2)),
    ("step_delay_ms:500", Fault("step_delay_ms", 500)),
    ("disk_full", Fault("disk_full", None)),
    ("kill_at_step", "kill_at_step:N needs a whole number N >= 1 (training step)"),
    ("kill_at_step:0", "kill_at_step:N needs a whole number N >= 1 (training step)"),
    ("flat_prompts:-1", "flat_prompts:N needs a whole number N >= 1 (divisor)"),
    ("oom_above:x", "oom_above:N needs a whole number N >= 0 (sequences)"),
    ("oom_ranks_below:2.5", "oom_ranks_below:N needs a whole number N >= 0 (ranks)"),
    ("disk_full:1", "disk_full takes no number"),
    ("kill_at_stp:3", "unknown hook 'kill_at_stp'"),
    ("oom", "unknown hook 'oom'"),
]


@pytest.mark.parametrize("raw, want", CASES)
def test_a_value_parses_to_its_hook_or_an_error_naming_the_hook_and_the_allowed(raw: str, want: Fault | str | None):
    if isinstance(want, str):
        with pytest.raises(ValueError) as err:
            parse(raw)
        assert f"{FAULT_ENV}={raw!r}" in str(err.value) and want in str(err.value) and ALLOWED in str(err.value)
    else:
        assert parse(raw) == want


def test_every_hook_is_in_the_table_and_the_docs():
    assert {c[1].hook for c in CASES if isinstance(c[1], Fault)} == set(HOOKS)
    row = next(line for line in (REPO / "docs" / "contributing.md").read_text().splitlines()
               if line.startswith(f"| `{FAULT_ENV}` |"))
    assert all(f"`{h.name}:N`" in row if h.unit else f"`{h.name}`" in row for h in HOOKS.values())


def test_a_reader_gets_its_own_hook_only():
    env = {FAULT_ENV: "oom_above:4"}
    assert faulthooks.number("oom_above", env) == 4
    assert faulthooks.number("oom_ranks_below", env) is None and not faulthooks.is_set("disk_full", env)
    assert faulthooks.number("kill_at_step", {}) is None and faulthooks.active({}) is None
    assert faulthooks.is_set("disk_full", {FAULT_ENV: "disk_full"})
    with pytest.raises(ValueError, match="unknown hook 'nope'"):  # a bad value fails every reader
        faulthooks.number("kill_at_step", {FAULT_ENV: "nope:1"})
    with pytest.raises(ValueError, match="no hook with a number of that name"):  # a reader's own typo
        faulthooks.number("disk_full", env)
    assert faulthooks.without({FAULT_ENV: "disk_full", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_readers_in_the_job_parse_through_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from lorarl.io import disk_full_hook
    from lorarl.train.checkpoint import _fault

    monkeypatch.setenv(FAULT_ENV, "disk_full")
    with pytest.raises(OSError, match="No space left on device"):
        disk_full_hook(tmp_path / "summary.json")
    monkeypatch.setenv(FAULT_ENV, "kill_at_step:x")
    with pytest.raises(ValueError, match="kill_at_step:N needs a whole number"):
        _fault("kill_at_step", 1, tmp_path)
    monkeypatch.setenv(FAULT_ENV, "kill_at_step:3")
    _fault("kill_after_save", 3, tmp_path)  # another hook of the same step: nothing fires (no SIGKILL)


SCANNED = ("lorarl", "workflow", "scripts")  # the code that runs a study (tests and bench set the hooks)
HOME = Path("lorarl/faulthooks.py")


def fault_reads(root: Path) -> list[str]:
    """file:line of each mention of the variable's name in code (a string "LORARL_FAULT", or a FAULT_ENV name
    other than faulthooks' own) outside lorarl/faulthooks.py; docstrings and comments may name it."""
    found = []
    for top in SCANNED:
        for f in sorted((root / top).rglob("*.py")) + sorted((root / top).rglob("*.smk")):
            rel = f.relative_to(root)
            if rel == HOME or "__pycache__" in f.parts:
                continue
            src = f.read_text()
            if f.suffix == ".smk":
                found += [f"{rel}:{i}" for i, line in enumerate(src.splitlines(), 1)
                          if FAULT_ENV in line.split("#", 1)[0]]
                continue
            for node in ast.walk(ast.parse(src)):
                if (isinstance(node, ast.Constant) and node.value == FAULT_ENV
                        or isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                            isinstance(t, ast.Name) and t.id == "FAULT_ENV"
                            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_no_module_but_faulthooks_reads_the_variable():
    assert not fault_reads(REPO), "parse LORARL_FAULT with lorarl.faulthooks (number, is_set, active)"


def test_the_scan_sees_a_reader_of_its_own(tmp_path: Path):
    pkg = tmp_path / "lorarl"
    pkg.mkdir()
    (tmp_path / "workflow").mkdir()
    (tmp_path / "scripts").mkdir()
    (pkg / "faulthooks.py").write_text('FAULT_ENV = "LORARL_FAULT"\n')
    (pkg / "ok.py").write_text('"""Test hook: LORARL_FAULT=disk_full."""\nfrom lorarl.faulthooks import FAULT_ENV\n')
    (pkg / "a.py").write_text('import os\n\nraw = os.environ.get("LORARL_FAULT", "")\n')
    (pkg / "b.py").write_text('import os\n\nFAULT_ENV = "LORARL" + "_FAULT"\nraw = os.environ[FAULT_ENV]\n')
    (tmp_path / "workflow" / "x.smk").write_text('# LORARL_FAULT in a comment\nenv = "LORARL_FAULT"\n')
    assert fault_reads(tmp_path) == ["lorarl/a.py:3", "lorarl/b.py:3", "workflow/x.smk:2"]
