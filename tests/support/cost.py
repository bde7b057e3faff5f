"""Cost-ledger records (lorarl.ledger's format) written by hand, for the roll-up, report and status tests."""

from __future__ import annotations

from pathlib import Path

from lorarl import ledger


def make_record(stage: str, cell: str, *, wall: float, phases: dict[str, float], gpus: int = 0, cpus: int = 2,
                members: dict[str, float] | None = None, study: str = "rep", key: str | None = None,
                cpu_s: float = 0.0, pid: int = 1, steps: int = 0) -> dict:
    idle = wall - sum(phases.values())
    assert idle >= 0, (wall, phases)
    return {"schema": 1, "stage": stage, "key": key or stage, "study": study, "cell": cell, "members": members,
            "member_steps": None, "until": None, "steps": steps, "job_id": None, "restart_count": 0, "host": "h",
            "pid": pid, "outcome": "completed", "started_at": 0.0, "ended_at": wall, "wall_s": wall,
            "devices": {"gpus": gpus, "cpus": cpus, "gpu_source": "test", "cpu_source": "test"},
            "phases_s": phases, "idle_s": idle, "cpu_s": cpu_s, "cpu_idle_share": None}


def put(results: Path, study: str, folder: str, rec: dict) -> Path:
    """`folder`: a cell id, `.packs/<id>`, `.aggregate`; `models/<name>` for a base build."""
    where = (results / "models" / ".logs" / folder.split("/", 1)[1] if folder.startswith("models/")
             else results / study / folder) / ledger.DIR
    return ledger.write(where, rec)
