"""MLflow store per-step overhead and concurrent writers: sqlite (flock) vs tracking server (PostgreSQL).

    python bench/tracking_store.py [--steps 40] [--writers 8] [--writer-steps 25]

1. Overhead: one process, two Trackers (sqlite, server), one batch of 10 metrics per step, interleaved
   A B A B ... so machine load hits both alike; prints median ms per step and the ratio server / sqlite.
2. Concurrency: `--writers` processes start together (tests/support/tracking.py, synthetic metrics through
   lorarl's Tracker, one batch per step) against each store; prints rows lost and duplicated (from the
   store), median and p95 time of a step's flush, and how many flushes went pending (the store was busy
   past the per-flush budget; caught up later).
The server is `lorarl tracking serve --auth` on a free 127.0.0.1 port (basic auth on, as beyond loopback).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.tracking import ServerProcess, count_rows, run_writers  # noqa: E402

from lorarl.tracking import client as tracking, server as tracking_server  # noqa: E402


def overhead(results: Path, uri: str, steps: int) -> dict[str, list[float]]:
    a = tracking.Tracker(results, "overhead", tracking="sqlite")
    b = tracking.Tracker(results, "overhead", tracking=uri)
    for t in (a, b):
        t.start("c", "c", tags={}, params={"x": 1})
    times: dict[str, list[float]] = {"sqlite": [], "server": []}
    for step in range(1, steps + 1):
        row = {"step": step, **{f"m{i}": step * 0.1 + i for i in range(10)}}
        for name, t in (("sqlite", a), ("server", b)) if step % 2 else (("server", b), ("sqlite", a)):
            t0 = time.perf_counter()
            t.log_metrics([row], wait=False)
            times[name].append(time.perf_counter() - t0)
    for t in (a, b):
        t.finish()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--writer-steps", type=int, default=25)
    args = ap.parse_args()
    import mlflow

    root = Path(tempfile.mkdtemp(prefix="lorarl-bench-trk-", dir="/tmp"))
    os.chmod(root, 0o711)
    srv = ServerProcess(root / "server", auth=True)
    (root / "server").mkdir()
    try:
        t0 = time.perf_counter()
        uri = srv.start()
        print(f"server {uri} up in {time.perf_counter() - t0:.0f} s (PostgreSQL, basic auth)")
        for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(k, None)
        # as a job: only the credentials file's path; Tracker hands user + password to MLflow's client
        os.environ[tracking_server.CREDENTIALS_ENV] = str(srv.creds)

        times = overhead(root / "ov", uri, args.steps)
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(f"\nper-step flush, 10 metrics, {args.steps} steps interleaved, one process:")
        print(f"  sqlite  {med['sqlite']:.1f} ms   server  {med['server']:.1f} ms   ratio server/sqlite "
              f"{med['server'] / med['sqlite']:.2f}")

        print(f"\n{args.writers} concurrent writers x {args.writer_steps} steps x 5 metrics (one flush per step):")
        print(f"  {'store':7} {'rows':>5} {'lost':>5} {'dup':>4} {'median ms':>10} {'p95 ms':>8} {'pending':>8} {'wall s':>7}")
        for name, value in (("sqlite", "sqlite"), ("server", uri)):
            res = root / f"conc-{name}"
            res.mkdir()
            env = {**srv.env(), tracking.TRACKING_ENV: value}
            t0 = time.perf_counter()
            reports = run_writers(args.writers, res, "conc", args.writer_steps, env)
            wall = time.perf_counter() - t0
            client = mlflow.MlflowClient(tracking.resolve_tracking(value, res))
            rows = count_rows(client, "conc", args.writers, args.writer_steps)
            flat = sorted(x for r in reports for x in r["step_times"])
            p95 = flat[int(0.95 * (len(flat) - 1))] * 1000
            print(f"  {name:7} {rows['expected_rows']:>5} {rows['lost']:>5} {rows['duplicated']:>4} "
                  f"{statistics.median(flat) * 1000:>10.1f} {p95:>8.1f} {sum(r['behind'] for r in reports):>8} "
                  f"{wall:>7.1f}")
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
