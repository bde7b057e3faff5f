"""The MLflow tracking server as a Slurm job, on the Slurm test cluster (tests/slurm/cluster.sh up).

`lorarl tracking serve --slurm` submits the server (MLflow + its own PostgreSQL) as a job, waits for it
to serve and prints its URI; a 2-cell study then runs with `snakemake --profile slurm --config
tracking=<uri> tracking_credentials=<file>` (every train/evaluate job a Slurm job too) and every (metric,
step) of each cell's metrics.csv is in the server exactly once; `scancel` stops the server cleanly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from lorarl.report.mlflow_links import VIEW
from lorarl.tracking import server as tracking_server
from lorarl.tracking import credentials as tracking_credentials
from tests.support.slurm import REPO, env, snakemake_cmd, study, workdir_for

pytestmark = pytest.mark.slurm


def _job_gone(job_id: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            return subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                                  text=True).stdout.strip()
        time.sleep(1)
    raise AssertionError(f"job {job_id} still in squeue after {timeout_s} s")


def test_server_as_a_slurm_job_serves_a_slurm_study(models, tmp_path: Path):
    root = Path(tempfile.mkdtemp(prefix="lorarl-trk-slurm-", dir="/tmp"))
    os.chmod(root, 0o711)  # as root, PostgreSQL runs as `postgres` and must traverse it
    state, creds = root / "state", root / "credentials"
    job_id = None
    try:
        serve = subprocess.run(
            [sys.executable, "-m", "lorarl.cli", "tracking", "serve", "--slurm", "--port", "0", "--state", str(state),
             "--artifacts", str(root / "artifacts"), "--credentials", str(creds), "--partition", "cpu", "--cpus", "1",
             "--mem-gb", "2", "--time", "60", "--wait", "600"],
            cwd=REPO, capture_output=True, text=True, env=env(), timeout=700)
        found = re.search(r"submitted as Slurm job (\d+)", serve.stdout)
        job_id = found.group(1) if found else None
        assert serve.returncode == 0, serve.stdout[-3000:] + serve.stderr[-3000:]
        info = json.loads((state / "server.json").read_text())
        assert info["slurm_job_id"] == job_id and info["bind"] == "0.0.0.0" and info["auth"] is True
        uri = info["uri"]
        assert f"tracking: {uri}" in serve.stdout and f"scancel {job_id}" in serve.stdout
        assert subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                              text=True).stdout.strip() == "RUNNING"
        assert "#SBATCH --partition=cpu" in (state / "serve.sbatch").read_text()
        assert oct(creds.stat().st_mode & 0o777) == "0o600"

        wd = workdir_for(tmp_path, models, study("trk", {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}))
        cmd = [c for c in snakemake_cmd(wd) if c != "tracking=sqlite"] + [f"tracking={uri}",
                                                                          f"tracking_credentials={creds}"]
        run_env = {k: v for k, v in env().items() if not k.startswith("MLFLOW_TRACKING_")}
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=run_env, timeout=1500)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        assert not (wd / "results" / "mlflow.db").exists()  # nothing went to sqlite

        import mlflow

        secret = tracking_credentials.load_credentials(creds)
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = (secret["username"],
                                                                                          secret["password"])
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name("trk")
        for cell in ("s0", "s1"):
            cdir = wd / "results" / "trk" / cell
            prov = json.loads((cdir / "provenance" / "train.json").read_text())
            assert prov["submissions"][0]["executor"] == "slurm"
            run_id = json.loads((cdir / "summary.json").read_text())["mlflow_run_id"]
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED" and run.info.experiment_id == exp.experiment_id
            assert len(client.search_runs([exp.experiment_id], f"tags.`lorarl.cell_id` = '{cell}'")) == 1
            csv = pd.read_csv(cdir / "metrics.csv")
            assert list(csv["step"]) == [1, 2, 3]
            for col in csv.columns.drop("step"):
                want = [(int(s), float(v)) for s, v in zip(csv["step"], csv[col]) if pd.notna(v)]
                got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, col))
                assert [s for s, _ in got] == [s for s, _ in want], col  # every (metric, step) exactly once
                assert [v for _, v in got] == pytest.approx([v for _, v in want]), col
            assert [m.step for m in client.get_metric_history(run_id, "eval/synthetic/pass_at_1")] == [3]
            report = (wd / "results" / "trk" / "report.html").read_text()  # links to this server's UI
            assert f'href="{uri}/#/experiments/{exp.experiment_id}/runs/{run_id}{VIEW}"' in report

        subprocess.run(["scancel", job_id], check=True, timeout=30)  # SIGTERM: MLflow, then PostgreSQL, stop
        assert "CANCELLED" in _job_gone(job_id)
        job_id = None
        pg_log = (state / "postgres" / "postgres.log").read_text()
        assert "database system is shut down" in pg_log  # a clean shutdown, not a kill
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], timeout=30)
            _job_gone(job_id)
        shutil.rmtree(root, ignore_errors=True)
