"""One answer to "was the code dirty?": the MLflow tags and the report (lorarl.tracking.client.git_state) and the
job's provenance (lorarl.provenance.git_info) both take it from lorarl.gitrepo.code_state, so a study
file not yet in git makes both say dirty (the tags said `git.dirty false` while the provenance said dirty)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lorarl.gitrepo import code_state
from lorarl.provenance import git_info
from lorarl.tracking.client import git_state


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def answers(repo: Path) -> tuple[str, bool, bool]:
    return git_state(repo)["git.dirty"], git_info(repo)["dirty"], code_state(repo)["dirty"]


def test_tags_report_and_provenance_agree_on_dirty(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    (repo / ".gitignore").write_text("results/\n")
    (repo / "experiments" / "demo.yaml").write_text("name: demo\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    (repo / "results").mkdir()
    (repo / "results" / "out.json").write_text("{}")  # ignored outputs never make the code dirty
    assert answers(repo) == ("false", False, False)
    (repo / "experiments" / "mine.yaml").write_text("name: mine\n")  # the user's own study, not in git
    assert answers(repo) == ("true", True, True)
    assert git_info(repo)["untracked"] == ["experiments/mine.yaml"] and "name: mine" in git_info(repo)["diff"]
    (repo / "experiments" / "mine.yaml").unlink()
    (repo / "experiments" / "demo.yaml").write_text("name: demo2\n")  # a tracked change
    assert answers(repo) == ("true", True, True)
    assert git_state(tmp_path / "not-a-repo") == {"git.sha": "unknown", "git.dirty": "unknown"}
    assert git_info(tmp_path / "not-a-repo")["dirty"] is None
