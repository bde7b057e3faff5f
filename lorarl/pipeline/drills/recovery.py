"""What a user runs after Snakemake died mid-study (its lock and "incomplete" marks left behind): one place.

`COMMANDS[profile]` = (unlock, run): the commands word for word as docs/slurm.md and docs/reliability.md
give them, run from the repo root (tests/project/test_docs.py checks that both pages show each one), `{study}` being
the study file that was running (the pages write `experiments/<study>.yaml`): `--config studies=...` names it,
so the recovery reruns that study, not config/config.yaml's default one. `run` is also how a study is started.
They work on every profile because `rerun-incomplete` is set in profiles/default, the workflow profile
Snakemake applies on top of any `--profile`: without it `snakemake all` stops at once with Snakemake's
IncompleteFilesException after a kill.

The fault driver (lorarl.pipeline.drills.faults) and tests/pipeline/test_faults.py start and recover studies with exactly
these commands, in a folder laid out as a repo root (`workspace`): the Snakefile, workflow/ and profiles/
linked from this repository, and its own config/config.yaml naming the study.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
STUDY = "experiments/<study>.yaml"  # how the pages write the study that was running
_STUDIES = """--config studies='["{study}"]'"""  # the study the commands (re)run, as the README's table writes it
COMMANDS: dict[str, tuple[str, str]] = {  # profile -> (unlock, run), as the docs give them
    "local": (f"snakemake --unlock {_STUDIES}", f"snakemake all {_STUDIES}"),
    "slurm": (f"snakemake --profile slurm --unlock all {_STUDIES}", f"snakemake --profile slurm all {_STUDIES}"),
}
PAGES = ("docs/slurm.md", "docs/reliability.md")  # the pages that tell a user these commands
LINKED = ("Snakefile", "workflow", "profiles")  # what a workspace links from this repository


def shown(command: str, study: str = STUDY) -> str:
    """A documented command for `study`, as a user types it (the pages: `experiments/<study>.yaml`)."""
    return command.format(study=study)


def argv(command: str, study: str) -> list[str]:
    """A documented command for `study` as an argument list (`snakemake` is found on PATH, as a user's shell
    finds it)."""
    words = shlex.split(shown(command, study))
    if not words or words[0] != "snakemake":
        raise ValueError(f"{command!r}: allowed: a `snakemake ...` command")
    return words


def workspace(root: Path, config: dict[str, Any]) -> Path:
    """`root` laid out as a repo root: Snakefile, workflow/ and profiles/ linked from this repository, and
    config/config.yaml = this repository's config/config.yaml updated with `config` (e.g. `studies`)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    write_config(root, config)
    return root


def write_config(root: Path, config: dict[str, Any]) -> None:
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "config.yaml").write_text(yaml.safe_dump({**base, **config}, sort_keys=False))


def run(command: str, root: Path, env: dict[str, str], log: Path, study: str) -> int:
    """Run one documented command for `study` in `root` (its output appended to `log`); its exit status."""
    with open(log, "a") as fh:
        fh.write(f"$ {shown(command, study)}\n")
        fh.flush()
        return subprocess.run(argv(command, study), cwd=root, env=env, stdout=fh,
                              stderr=subprocess.STDOUT).returncode


def recover(root: Path, env: dict[str, str], log: Path, study: str, profile: str = "local") -> int:
    """The documented recovery of `study` in `root`: unlock, then run. The exit status of the first that fails,
    else 0."""
    for command in COMMANDS[profile]:
        rc = run(command, root, env, log, study)
        if rc:
            return rc
    return 0
