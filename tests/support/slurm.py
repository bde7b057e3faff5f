"""The Slurm pipeline's pieces: the study, its workdir, the Snakemake command on the cluster, progress waits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.study import tiny_study, TRAIN


REPO = Path(__file__).resolve().parents[2]


SLURM = {
    "base": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
    "train": {"partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 60,
              "signal_delay_s": 30},
    "evaluate": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
    "diagnose": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 30},
}


def build_slurm_models(tmp_path_factory) -> tuple[Path, Path]:
    """results/models/tiny-test, built once (copied into every workdir so no test rebuilds it), and a
    perturbed copy as a distillation teacher (varied rewards: the adapter really learns)."""
    from lorarl.models import build_base
    from tests.support.trained import perturbed_teacher

    root = tmp_path_factory.mktemp("slurm_models")
    base = root / "models" / "tiny-test"
    build_base("tiny-test", base, threads=1)
    return base, perturbed_teacher(base, root / "teacher")


def workdir_for(tmp: Path, models: tuple[Path, Path], study: dict) -> Path:
    (tmp / "results" / "models").mkdir(parents=True)
    shutil.copytree(models[0], tmp / "results" / "models" / "tiny-test")
    (tmp / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp


def snakemake_cmd(workdir: Path, slurm: dict = SLURM, targets: tuple[str, ...] = ("all",)) -> list[str]:
    # launcher: slurm comes from the profile (profiles/slurm/cluster.yaml); only the resources shrink
    studies = json.dumps([str(workdir / "study.yaml")])
    return [sys.executable, "-m", "snakemake", *targets, "--profile", "slurm", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), "--config", f"studies={studies}", "results=results",
            "slurm=" + json.dumps(slurm), "tracking=sqlite"]  # the profile's server: tests/tracking/test_tracking_server.py


def wait_progress(paths: list[Path], min_step: int, not_pid: int | None, proc: subprocess.Popen,
                  timeout: float = 300) -> dict:
    """The first cell's progress.json once every cell in ``paths`` is at step >= min_step, written by a process
    other than ``not_pid`` (a requeued job's); fails when snakemake ends first or after ``timeout`` s, with what
    the cluster and the jobs' logs say (cluster_report)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ps = [_progress(p) for p in paths]
        if all(p and p["step"] >= min_step and p["pid"] != not_pid for p in ps):
            return ps[0]
        if proc.poll() is not None:
            pytest.fail(f"snakemake ended (rc {proc.returncode}) before step {min_step}: {ps}\n"
                        + cluster_report(paths[0].parents[4]))
        time.sleep(0.1)
    pytest.fail(f"not at step >= {min_step} (from a new process) after {timeout} s: {[_progress(p) for p in paths]}\n"
                + cluster_report(paths[0].parents[4]))


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


def cluster_report(workdir: Path | None = None) -> str:
    """What a failed Slurm test needs to be understood from CI's output alone: the queue with each job's
    reason, the nodes, slurmctld's last lines, and under ``workdir`` the tail of every job log and of
    snakemake.log."""
    def cmd(*argv: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return (out.stdout + out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"({e})"

    parts = [f"$ squeue\n{cmd('squeue', '-h', '-o', '%i %P %j %T %M %D %R')}",
             f"$ sinfo -N\n{cmd('sinfo', '-h', '-N', '-o', '%N %P %t %E')}",
             f"$ scontrol show job\n{cmd('scontrol', '-o', 'show', 'job')}"]
    state = Path(os.environ.get("LORARL_SLURM_DIR", "/tmp/lorarl-slurm"))
    for log in [state / "log" / "slurmctld.log", *sorted((state / "log").glob("slurmd*.log"))]:
        parts.append(f"== {log.name}\n{_tail(log, 20)}")
    if workdir is not None:
        logs = sorted(workdir.rglob("logs/**/*_log.*")) + sorted(workdir.rglob("snakemake.log"))
        for f in logs[-8:]:
            parts.append(f"== {f.relative_to(workdir)}\n{_tail(f)}")
    return "\n".join(parts)


def env(**extra: str) -> dict[str, str]:
    # LORARL_POLL_S: a cancelled job is noticed within seconds (default: a minute)
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "LORARL_POLL_S": "3", **extra}


def snakemake(workdir: Path, timeout: float = 900, slurm: dict = SLURM) -> subprocess.CompletedProcess:
    # cwd = the repo root: `--profile slurm` is looked up there (./slurm -> profiles/slurm)
    return subprocess.run(snakemake_cmd(workdir, slurm), cwd=REPO, capture_output=True, text=True, env=env(),
                          timeout=timeout)


def study(name: str, axes: dict, **train) -> dict:
    return tiny_study(name, axes=axes, train={**TRAIN, "checkpoint_every": 2, **train})


def mlflow_client(workdir: Path):
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")


def _progress(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
