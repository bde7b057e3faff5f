"""The git state of the code that runs (one place for both consumers): MLflow run tags and the report
(`lorarl.tracking.client.git_state`: sha + dirty) and job provenance (`lorarl.provenance`:
sha, dirty, the diff itself and the untracked files). Both take sha and dirty from `code_state`, so they
give one answer: dirty = a tracked file differs from HEAD or an untracked file is there (a study file not
yet in git is part of what ran; `.gitignore`d files such as results/ are not)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]  # the checkout lorarl runs from


def git(repo: str | Path, *args: str, timeout: float = 60, ok_codes: tuple[int, ...] = (0,)) -> str | None:
    """stdout of ``git -C repo args``; None when git is missing, times out or exits otherwise."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode in ok_codes else None


def head_sha(repo: str | Path = REPO) -> str | None:
    out = git(repo, "rev-parse", "HEAD")
    return out.strip() if out else None


def tracked_diff(repo: str | Path = REPO) -> str:
    """``git diff HEAD`` (changes to tracked files; empty when clean)."""
    return git(repo, "diff", "HEAD", "--no-color") or ""


def untracked_files(repo: str | Path = REPO) -> list[str]:
    return (git(repo, "ls-files", "--others", "--exclude-standard") or "").split()


def code_state(repo: str | Path = REPO) -> dict[str, Any]:
    """{"sha": HEAD or None (no git, not a checkout), "diff": `git diff HEAD`, "untracked": names,
    "dirty": a tracked change or an untracked file (None without a sha)}."""
    sha = head_sha(repo)
    if sha is None:
        return {"sha": None, "diff": "", "untracked": [], "dirty": None}
    diff, untracked = tracked_diff(repo), untracked_files(repo)
    return {"sha": sha, "diff": diff, "untracked": untracked, "dirty": bool(diff.strip()) or bool(untracked)}
