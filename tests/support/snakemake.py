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


def snakemake_env(**extra: str) -> dict[str, str]:
    """This process's environment, its interpreter's bin first on PATH (the rules call `lorarl`), plus ``extra``."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}


def snakemake_cmd(workdir: Path, *args: str, cores: int = 2, configfile: Path | None = None) -> list[str]:
    """Snakemake on the repo's Snakefile in ``workdir`` with its config (``workdir``/config.yaml unless given)."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(configfile or workdir / "config.yaml"), "--cores", str(cores), *args]


def run_snakemake(workdir: Path, *args: str, cores: int = 2, configfile: Path | None = None,
                  env: dict[str, str] | None = None, check: bool = True,
                  timeout: float | None = None) -> subprocess.CompletedProcess:
    """The tests' one Snakemake run (snakemake_cmd, from ``workdir``, ``env`` added to snakemake_env); with
    ``check`` its exit status is asserted 0, the tails of its output in the message."""
    proc = subprocess.run(snakemake_cmd(workdir, *args, cores=cores, configfile=configfile), cwd=workdir,
                          capture_output=True, text=True, env=snakemake_env(**(env or {})), timeout=timeout)
    assert not check or proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def jobs_run(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's job-stats table, the last it printed (a dry run prints it to stdout, a run to stderr)."""
    out, on = {}, False
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        parts = line.split()
        if line.startswith("job ") and "count" in line:
            on, out = True, {}
        elif on and len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            out[parts[0]] = int(parts[1])
        elif on and parts and parts[0] == "total":
            on = False
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
