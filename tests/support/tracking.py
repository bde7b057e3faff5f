"""Helpers of the tracking tests and bench/tracking_store.py.

Run as a script: one synthetic cell writing to MLflow through lorarl.tracking.client.Tracker. It waits for <go>
to exist, so that every writer logs at the same time, then logs <steps> steps of 5 metrics, one batch
per step (the most contention a store can get), a summary, the end. ServerProcess: `lorarl tracking
serve` on a loopback port, killable and restartable.

    python tests/support/tracking.py <results> <study> <cell> <steps> <go-file>   ($LORARL_TRACKING: the store)
Prints one JSON line: run id, per-step log times (s), steps that went pending.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

METRICS = ("reward", "loss", "kl", "entropy", "grad_norm")


def main(results: str, study: str, cell: str, steps: int, go: str) -> None:
    from lorarl.tracking.client import Tracker

    tracker = Tracker(results, study)
    while not Path(go).exists():
        time.sleep(0.01)
    run_id = tracker.start(cell, run_name=cell, tags={"axis.writer": cell}, params={"cell": cell})
    times, behind = [], 0
    for step in range(1, steps + 1):
        row = {"step": step, **{m: (step * 0.01 + i) for i, m in enumerate(METRICS)}}
        t0 = time.perf_counter()
        behind += not tracker.log_metrics([row], wait=False)  # as the trainer's flushes
        times.append(time.perf_counter() - t0)
    tracker.log_summary({"final_train_reward": 1.0})
    tracker.finish()
    hold = os.environ.get("LORARL_TEST_HOLD")
    if hold:  # stay alive, with a child process, until <hold> is deleted: the test reads /proc meanwhile
        child = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                                  "while os.path.exists(sys.argv[1]): time.sleep(0.05)", hold])
        Path(f"{hold}.{cell}.ready").write_text(str(child.pid))
        child.wait()
    print(json.dumps({"cell": cell, "run_id": run_id, "step_times": times, "behind": behind, "pid": os.getpid()}))


def run_writers(n: int, results: Path, study: str, steps: int, env: dict[str, str]) -> list[dict]:
    """n writer processes at once (started together through a go-file); their JSON reports."""
    go = Path(results) / f".go-{study}"
    env = {**env, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, __file__, str(results), study, f"w{i}", str(steps), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(n)]
    time.sleep(0.5)
    go.write_text("go")
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def count_rows(client, study: str, n: int, steps: int) -> dict:
    """Lost and duplicated (metric, step) rows over the active runs of `study` (cells w0..w{n-1})."""
    exp = client.get_experiment_by_name(study)
    runs = client.search_runs([exp.experiment_id], "tags.`lorarl.cell_id` != ''")  # not the study run
    per_cell = Counter(r.data.tags["lorarl.cell_id"] for r in runs)
    lost = duplicated = 0
    for r in runs:
        for m in METRICS:
            seen = Counter(x.step for x in client.get_metric_history(r.info.run_id, m))
            lost += sum(1 for s in range(1, steps + 1) if s not in seen)
            duplicated += sum(c - 1 for c in seen.values() if c > 1)
    return {"runs": len(runs), "cells": dict(per_cell), "lost": lost, "duplicated": duplicated,
            "expected_rows": n * steps * len(METRICS), "finished": sum(r.info.status == "FINISHED" for r in runs)}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])


class ServerProcess:
    """`lorarl tracking serve [--auth]` on a free port of `host` (default 127.0.0.1; another interface:
    auth comes on by itself) in its own process group (MLflow, its
    workers and PostgreSQL all in it): start, kill -9 the whole group (a dead server node), restart on
    the same port and state (PostgreSQL recovers), stop. State under /tmp (as root, PostgreSQL runs as
    `postgres`, which must traverse it)."""

    def __init__(self, root: Path, auth: bool = True, host: str = "127.0.0.1"):
        self.root, self.auth, self.host = Path(root), auth, host
        self.state, self.creds = self.root / "state", self.root / "credentials"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.uri = ""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
        return {**env, "PYTHONPATH": str(REPO), "LORARL_TRACKING_CREDENTIALS": str(self.creds)}

    def start(self, timeout_s: float = 300) -> str:
        import socket

        if not self.port:
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        info = self.state / "server.json"
        info.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "lorarl.cli", "tracking", "serve", "--host", self.host, "--port",
               str(self.port), "--state", str(self.state), "--artifacts", str(self.root / "artifacts"),
               "--credentials", str(self.creds)] + (["--auth"] if self.auth else [])
        log = open(self.root / "serve.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not info.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tracking server did not start:\n{(self.root / 'serve.log').read_text()[-4000:]}")
            time.sleep(0.3)
        self.uri = json.loads(info.read_text())["uri"]
        return self.uri

    def kill(self) -> None:
        """SIGKILL to every process of the server (MLflow, workers, PostgreSQL): nothing shuts down cleanly."""
        import signal

        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            _wait_group_gone(self.proc.pid)

    def stop(self) -> None:
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        _wait_group_gone(self.proc.pid, then_kill=True)


def _wait_group_gone(pgid: int, then_kill: bool = False, timeout_s: float = 30) -> None:
    import signal

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    if then_kill:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
