"""The one Snakemake runner of the tests, its job counts, and the active cells' MLflow runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
import yaml

from tests.support.study import tiny_study

REPO = Path(__file__).resolve().parents[2]


STUDY = tiny_study("e2e")


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def jobs_run(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Parse Snakemake's job-stats table from its log."""
    out, on = {}, False
    for line in proc.stderr.splitlines():
        if line.startswith("job ") and "count" in line:
            on = True
            continue
        if on:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
                out[parts[0]] = int(parts[1])
            elif parts and parts[0] == "total":
                break
    return out


def study_dir(wd: Path) -> Path:
    """The 2-cell study and a local-launcher config in ``wd``."""
    (wd / "study.yaml").write_text(yaml.safe_dump(STUDY))
    (wd / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(wd / "study.yaml")], "results": "results", "launcher": "local", "slurm": {}}))
    return wd


def active_cell_runs(results: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{results}/mlflow.db")
    exp = client.get_experiment_by_name("e2e")
    runs = client.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags.get("lorarl.base") != "true" and "lorarl.study_run" not in r.data.tags], client
