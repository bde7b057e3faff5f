"""lorarl.train.salvage: a killed run's finished cell kept aside at the rerun's start (hard links, nothing copied)
and put back by its train job; only for a rerun caused by Snakemake's incomplete marks alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lorarl import paths
from lorarl.train import salvage

HASH = "abc123"


def finished(res: Path, cell: str = "c0", config_hash: str = HASH) -> Path:
    d = paths.cell_dir(res, "st", cell)
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    (d / "adapter" / "adapter_config.json").write_text("{}")
    (d / "metrics.csv").write_text("step,reward\n1,0.5\n")
    (d / "cell.json").write_text(json.dumps({"id": cell}))
    (d / "summary.json").write_text(json.dumps({"config_hash": config_hash, "state": "done", "resumed_from_steps": [2]}))
    return d


def snakemake_removes_outputs(d: Path) -> None:
    """What Snakemake does before it reruns a job: its declared outputs go."""
    for name in paths.CELL_OUTPUTS:
        p = d / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def test_kept_aside_by_hard_links_then_put_back_whole(tmp_path):
    d = finished(tmp_path)
    weights = d / "adapter" / "adapter_model.safetensors"
    assert salvage.keep_aside(tmp_path, "st", "c0", HASH)
    kept = d / salvage.SALVAGED
    assert (kept / "adapter" / "adapter_model.safetensors").stat().st_ino == weights.stat().st_ino  # no copy
    snakemake_removes_outputs(d)
    summary = salvage.restore(tmp_path, "st", "c0", HASH)
    assert summary == {"config_hash": HASH, "state": "done", "resumed_from_steps": [2]}
    assert weights.read_bytes() == b"weights" and (d / "metrics.csv").read_text() == "step,reward\n1,0.5\n"
    assert json.loads((d / "summary.json").read_text()) == summary and not kept.exists()
    assert salvage.restore(tmp_path, "st", "c0", HASH) is None  # nothing kept any more


def test_nothing_kept_for_outputs_that_are_not_whole_or_of_another_config(tmp_path):
    d = finished(tmp_path, config_hash="other")
    assert not salvage.keep_aside(tmp_path, "st", "c0", HASH) and not (d / salvage.SALVAGED).exists()
    d = finished(tmp_path, "c1")
    shutil.rmtree(d / "adapter")  # the job was killed before it published its adapter
    assert not salvage.keep_aside(tmp_path, "st", "c1", HASH) and not (d / salvage.SALVAGED).exists()


def test_only_a_rerun_for_incomplete_marks_keeps_and_any_other_drops(tmp_path):
    d = finished(tmp_path)
    assert salvage.keep_aside_for(["incomplete output files"], tmp_path, "st", "c0", HASH)
    assert (d / salvage.SALVAGED).is_dir()
    assert not salvage.keep_aside_for(["forced"], tmp_path, "st", "c0", HASH)  # --forcerun: retrain
    assert not (d / salvage.SALVAGED).exists()
    assert not salvage.keep_aside_for(["incomplete output files", "params have changed since last execution"],
                                      tmp_path, "st", "c0", HASH)
    assert not (d / salvage.SALVAGED).exists() and (d / "summary.json").exists()  # the outputs themselves untouched


def test_what_was_kept_for_another_config_is_dropped_not_restored(tmp_path):
    d = finished(tmp_path)
    assert salvage.keep_aside(tmp_path, "st", "c0", HASH)
    snakemake_removes_outputs(d)
    assert salvage.restore(tmp_path, "st", "c0", "changed") is None
    assert not (d / salvage.SALVAGED).exists() and not (d / "summary.json").exists()
