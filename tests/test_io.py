"""lorarl.io: atomic writes leave the target whole, and the next write removes what a killed writer left."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lorarl.io import atomic_write_text, read_json, write_json


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path):
    target = tmp_path / "a" / "x.json"
    write_json(target, {"b": 1, "a": [1, 2]})
    write_json(target, {"c": 3})
    assert read_json(target) == {"c": 3}
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"]


def test_failed_write_keeps_the_old_target(tmp_path: Path, monkeypatch):
    target = tmp_path / "x.txt"
    atomic_write_text(target, "old")

    def boom(*a, **k):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_next_write_removes_a_killed_writers_temporary_only(tmp_path: Path):
    """A SIGKILLed writer's temporary goes at the next write of the same target; a live writer's, another
    host's and another target's stay."""
    host = socket.gethostname().replace(".", "_")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "last_run.json"
    leftovers = {
        "dead": tmp_path / f".last_run.json.{host}.{dead.pid}.abc123.tmp",
        "alive": tmp_path / f".last_run.json.{host}.{os.getpid()}.def456.tmp",
        "other_host": tmp_path / f".last_run.json.otherhost.{dead.pid}.ghi789.tmp",
        "other_target": tmp_path / f".summary.json.{host}.{dead.pid}.jkl012.tmp",
    }
    for p in leftovers.values():
        p.write_text("{")
    write_json(target, {"ok": True})
    assert read_json(target) == {"ok": True}
    assert {k for k, p in leftovers.items() if p.exists()} == {"alive", "other_host", "other_target"}
