"""The report and the study's MLflow run show the code each cell's jobs ran, from the cells' own provenance records
(lorarl.provenance.cell_code), not the checkout at report time: cells trained on a dirty tree stay dirty after the
change is reverted, a study whose cells ran different code is flagged, and the checkout is shown apart, as such."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

from lorarl import provenance
from lorarl.tracking import client as tracking
from tests.support.report_fixture import make_study

CELLS = ("outcome-r1-s0", "outcome-r1-s1")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout


def ran(res: Path, cell: str, repo: Path, stage: str = "train") -> None:
    """A job of `cell` submitted from `repo` as it is now, and started."""
    path = provenance.provenance_path(res, "rep", cell, stage)
    index = provenance.record_submission(path, stage=stage, study="rep", cell=cell, config_hash=None,
                                         executor="local", slurm=None, repo=repo)
    provenance.record_attempt_start(path, index)


def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "code"
    repo.mkdir()
    (repo / "train.py").write_text("lr = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    return repo


def test_cells_that_ran_dirty_stay_dirty_after_the_change_is_reverted(tmp_path: Path, monkeypatch):
    from lorarl.pipeline.studyrun import study_run
    from lorarl.report import build
    from lorarl.language.study import load_study

    repo = checkout(tmp_path)
    sp, res = make_study(tmp_path, done=set(CELLS))
    (repo / "train.py").write_text("lr = 2\n")  # an uncommitted change the cells ran with
    for cell in CELLS:
        ran(res, cell, repo)
        ran(res, cell, repo, "evaluate")
    (repo / "train.py").write_text("lr = 1\n")  # reverted before the report
    real = tracking.git_state
    for where in (tracking, study_run):  # the checkout at report time
        monkeypatch.setattr(where, "git_state", lambda repo_=None: real(repo))
    assert real(repo)["git.dirty"] == "false"

    out = build(sp, res)
    table = pd.read_csv(out["provenance"]).set_index("cell")
    assert set(table.index) >= set(CELLS)
    assert table.loc[list(CELLS), "code/dirty"].astype(str).tolist() == ["True", "True"]
    assert table.loc["outcome-r1-s0", "code/stages"] == "evaluate, train"  # both jobs, one code state
    assert table.loc["outcome-r1-s0", "code/commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert table.loc["outcome-r16-s0", "code/stages"] == "no job record"
    page = out["report"].read_text()
    mine, then = page.split("The checkout at report time")
    assert "<td>True</td>" in mine and "same code (one code state)" in mine and "different code" not in mine
    assert "git.dirty</th><td>false" in then  # shown, and as the checkout's

    tags = study_run.code_tags(load_study(sp), res)  # the study's MLflow parent run
    assert tags["git.dirty"] == "true" and tags["checkout.git.dirty"] == "false"
    assert tags["lorarl.code_mixed"] == "false" and len(tags["git.diff_hash"]) == 16
    assert tags["git.sha"] == tags["checkout.git.sha"]


def test_a_study_whose_cells_ran_different_code_is_flagged(tmp_path: Path):
    from lorarl.pipeline.studyrun.study_run import code_tags
    from lorarl.report import build
    from lorarl.language.study import load_study

    repo = checkout(tmp_path)
    sp, res = make_study(tmp_path, done=set(CELLS))
    ran(res, CELLS[0], repo)
    (repo / "train.py").write_text("lr = 3\n")
    git(repo, "commit", "-qam", "later")
    ran(res, CELLS[1], repo)  # the second cell on a later commit
    page = build(sp, res)["report"].read_text()
    assert "The cells ran different code</b>: 2 code states" in page
    tags = code_tags(load_study(sp), res)
    assert tags["git.sha"] == "mixed" and tags["git.dirty"] == "false" and tags["lorarl.code_states"] == "2"


def test_a_pack_job_counts_for_its_members_and_unstarted_submissions_do_not(tmp_path: Path):
    repo = checkout(tmp_path)
    res = tmp_path / "results"
    pack = provenance.provenance_path(res, "rep", ".packs/p1", "pack")
    provenance.record_submission(pack, stage="pack", study="rep", cell="a,b", config_hash=None, executor="local",
                                 slurm=None, repo=repo)
    assert provenance.cell_code(res, "rep", ["a"], tracking.PACKAGES) == {"a": []}  # submitted, never started
    provenance.record_attempt_start(pack, 0)
    code = provenance.cell_code(res, "rep", ["a", "b", "c"], tracking.PACKAGES)
    assert code["a"][0]["stages"] == ["pack"] and code["a"] == code["b"] and code["c"] == []
    assert code["a"][0]["dirty"] is False and code["a"][0]["diff_hash"] is None
    assert set(code["a"][0]["packages"]) == set(tracking.PACKAGES)
    assert code["a"][0]["packages"]["torch"] not in ("absent", "unknown")  # read from the stored pip freeze
