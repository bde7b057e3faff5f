"""The Slurm job ids a stage's provenance file lists: read inside a job (the trainer tags its MLflow run
with them) from the file the launcher names in ``LORARL_PROVENANCE``. The file itself is written by
:mod:`lorarl.provenance`; this leaf module only reads it, so the trainer needs nothing above it."""

from __future__ import annotations

import json
from pathlib import Path

ENV_PATH = "LORARL_PROVENANCE"  # set inside a job: where that job's provenance file is


def read(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def job_ids(doc_or_path: dict | str | Path, executor: str | None = None) -> list[str]:
    """Every job id of this stage, in order: submissions (reruns) and their requeued attempts; with
    ``executor``, only that executor's submissions (``"slurm"``: the ids Slurm knows)."""
    doc = doc_or_path if isinstance(doc_or_path, dict) else read(doc_or_path)
    out: list[str] = []
    for sub in doc.get("submissions", []):
        if executor is not None and sub.get("executor") != executor:
            continue
        for jid in [sub.get("job_id")] + [a.get("job_id") for a in sub.get("attempts", [])]:
            if jid and str(jid) not in out:
                out.append(str(jid))
    return out
