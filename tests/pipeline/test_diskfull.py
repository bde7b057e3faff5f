"""Out of disk space while a cell writes its outputs (lorarl.pipeline.jobs.diskfull): a clear error, nothing of the
cell taken as done, no temporary folder left, the finished cell's files untouched. Once with the
fault hook (ENOSPC on summary.json), once for real on a 16 KiB tmpfs mounted over the cell's folder
(needs root; skipped without it)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.study import TRAIN, seeds, tiny_study

pytestmark = pytest.mark.slow

STUDY = tiny_study("df", eval=None,
                   task={"name": "synthetic", "n_train": 32, "n_eval": 8},
                   train={**TRAIN, "steps": 2, "max_completion_length": 8, "checkpoint_every": 0},
                   axes=seeds(0, 1, 2))


def _train(root: Path, cell: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LORARL_FAULT"}
    if fault:
        env["LORARL_FAULT"] = fault
    cmd = [sys.executable, "-m", "lorarl.cli", "run", str(root / "study.yaml"), cell, "--stages", "train",
           "--results", str(root), "--threads", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "logs" not in p.parts}


def test_disk_full_fails_the_cell_clearly_and_leaves_finished_cells(tmp_path: Path, tiny_test_base: Path):
    from tests.support.trained import place_base

    place_base(tiny_test_base, tmp_path)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    s0 = tmp_path / "df" / "s0"  # a finished cell (its files as train writes them; contents do not matter here)
    (s0 / "adapter").mkdir(parents=True)
    for name in ("summary.json", "cell.json", "adapter/adapter_model.safetensors", "metrics.csv"):
        (s0 / name).write_text(f"{name} of a finished cell\n")
    before = _digest(s0)

    hooked = _train(tmp_path, "s1", fault="disk_full")
    assert hooked.returncode != 0
    assert "out of disk space: the train stage of cell s1 could not write" in hooked.stderr
    assert "finished cells are untouched" in hooked.stderr
    s1 = tmp_path / "df" / "s1"
    assert not (s1 / "summary.json").exists() and not (s1 / ".train.tmp").exists()
    assert _digest(tmp_path / "df" / "s0") == before

    if os.geteuid() != 0:
        pytest.skip("a real tmpfs needs root")
    s2 = tmp_path / "df" / "s2"
    s2.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(s2)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        real = _train(tmp_path, "s2")
        assert real.returncode != 0
        assert "out of disk space: the train stage of cell s2" in real.stderr, real.stderr[-3000:]
        assert not (s2 / "summary.json").exists() and not (s2 / ".train.tmp").exists()
    finally:
        subprocess.run(["umount", str(s2)], check=False)
    assert _digest(tmp_path / "df" / "s0") == before
