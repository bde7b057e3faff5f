"""A resident job through Snakemake itself (issue 39 item 3): a study of 3 cells of 2, 5 and 4 steps in one
resident job of 2 places, its job process SIGKILLed mid-training (LORARL_FAULT=kill_at_step), then the same
`snakemake all` again finishes the study: every member the kill caught resumes from its own last checkpoint
(losing only the steps since), each cell's metrics.csv has every step once and equals its uninterrupted solo
run (a pack of one); then `--forcerun` of one cell's summary.json retrains that cell alone, solo (the TRL-based
trainer, equal to its solo job), its study-mates untouched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.pause import mlflow_steps, outputs
from tests.support.snakemake import jobs_run, run_snakemake
from tests.support.resident import assert_equal_runs
from tests.support.study import tiny_study

pytestmark = pytest.mark.slow

STUDY = tiny_study("rs", task={"name": "synthetic", "n_train": 64, "n_eval": 4},
                   train={"prompts_per_step": 2, "generations": 2, "max_completion_length": 16, "lr": 1e-3,
                          "checkpoint_every": 1},
                   eval={"max_new_tokens": 8},
                   reward={"answer_format": "last_number", "terms": {"integer_answer": 1.0}},
                   axes={"length": {"field": "train.steps", "prefix": "n", "values": [2, 5, 4]}})
CELLS = ("n2", "n5", "n4")


def killed_run(wd: Path, record: str) -> subprocess.CompletedProcess:
    """Snakemake runs the resident job (its record; the base model is the session's, placed) and the job SIGKILLs
    itself at the end of the step in which a member first reaches step 4 (n5's 4th, n4's 2nd; neither checkpointed yet).
    The members' own train jobs are not asked for: the rerun alone resumes them (with `all`, a member's train job
    running beside the killed job would resume its cell alone, as a pack of one: tests/train/test_cell_pause.py)."""
    return run_snakemake(wd, record, env={"LORARL_FAULT": "kill_at_step:4"}, check=False, timeout=900)


def files_of(d: Path) -> dict[str, tuple[int, bytes]]:
    """A trained cell's training outputs: mtime and content of each file."""
    return {str(p.relative_to(d)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in [d / "summary.json", d / "metrics.csv", d / "cell.json", *sorted((d / "adapter").iterdir())]}


def test_a_sigkilled_resident_job_resumes_through_snakemake_all_then_forcerun_retrains_one_cell_solo(
        tmp_path, tiny_test_base):
    from lorarl.pack.plan import pack_id
    from lorarl.pack.run import train_alone
    from lorarl.pipeline.jobs.launch import run_stage
    from lorarl.language.study import cell_table, load_study
    from tests.support.trained import place_base

    place_base(tiny_test_base, tmp_path / "results")  # the session's base model: no base_model job here

    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(tmp_path / "study.yaml")], "results": "results", "launcher": "local", "slurm": {},
         "pack": {"resident": True, "places": 2}}))
    res = tmp_path / "results" / "rs"
    pid = pack_id(list(CELLS), resident=True)
    first = killed_run(tmp_path, f"results/rs/.packs/{pid}.json")
    assert first.returncode != 0, first.stderr[-3000:]
    log = (res / ".packs" / f"{pid}.log").read_text()
    assert "SIGKILL to myself" in log and not (res / ".packs" / f"{pid}.json").exists(), log[-3000:]
    ledger = json.loads((res / ".packs" / f"{pid}.ledger.json").read_text())["segments"]
    assert [s["admitted"] for s in ledger] == [["n2", "n5"], ["n5", "n4"]]
    assert (res / "n2" / ".packed" / "summary.json").exists()  # n2 ended before the kill: staged
    ckpts = res / ".checkpoints"
    assert [p.name for p in (ckpts / "n5").glob("checkpoint-*")] == ["checkpoint-3"]  # lost its step 4 only
    assert [p.name for p in (ckpts / "n4").glob("checkpoint-*")] == ["checkpoint-1"]  # lost its step 2 only

    again = run_snakemake(tmp_path, "all")  # the same command, no fault: resumes both members in one new resident job
    stats = jobs_run(again)
    assert stats.get("train_pack") == 1 and stats.get("train") == 3 and stats.get("aggregate") == 1, stats
    rid = pack_id(['n5', 'n4'], resident=True)
    rec = json.loads((res / ".packs" / f"{rid}.json").read_text())  # the unfinished cells' group
    assert rec["resident"] == 2 and rec["trained"] == ["n4", "n5"], rec  # the rule's --places reached the job
    assert json.loads((res / ".packs" / f"{rid}.ledger.json").read_text())["segments"][0][
        "admitted"] == ["n5", "n4"]
    ref = tmp_path / "ref"  # each cell's uninterrupted solo run (a pack of one), in process
    ref.mkdir()
    (ref / "models").symlink_to(tmp_path / "results" / "models")
    cells = {c.id: c for c in cell_table(load_study(str(tmp_path / "study.yaml"))).cells}
    threads = torch.get_num_threads()
    try:
        for c in CELLS:
            train_alone("rs", cells[c], ref, threads=1)
    finally:
        torch.set_num_threads(threads)
    resumed = {"n2": [], "n5": [2, 3], "n4": [1]}  # n5: the slot boundary, then the kill's last checkpoint
    for c in CELLS:
        got = outputs(res / c)
        assert_equal_runs(got, outputs(ref / "rs" / c), resumed_from=resumed[c], steps=cells[c].config.train.steps)
        assert got[2]["pack"]["resident"] == 2
        assert mlflow_steps(tmp_path / "results", got[2]["mlflow_run_id"])[0] == list(range(1, got[2]["steps"] + 1))
        assert (res / c / "eval" / "synthetic.json").exists() and not (res / c / ".packed").exists()

    kept = {c: files_of(res / c) for c in ("n5", "n4")}
    forced = run_snakemake(tmp_path, "results/rs/n2/summary.json", "--forcerun", "results/rs/n2/summary.json")
    stats = jobs_run(forced)
    assert stats.get("train") == 1 and "train_pack" not in stats, stats  # that cell alone
    assert {c: files_of(res / c) for c in ("n5", "n4")} == kept  # its study-mates untouched
    solo = tmp_path / "solo"
    solo.mkdir()
    (solo / "models").symlink_to(tmp_path / "results" / "models")
    try:
        run_stage("train", str(tmp_path / "study.yaml"), "n2", str(solo), threads=1)  # its solo job, in process
    finally:
        torch.set_num_threads(threads)
    got, want = outputs(res / "n2"), outputs(solo / "rs" / "n2")
    assert "pack" not in got[2] and "pack" not in want[2]  # solo: the TRL-based trainer
    assert_equal_runs(got, want, resumed_from=[], steps=2)
