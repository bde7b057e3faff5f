"""`lorarl tracking serve`: its options and the command (lorarl.cli builds the subcommand; the server itself is
lorarl.tracking.server, its Slurm form lorarl.tracking.slurm)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_arguments(sv: Any) -> None:
    """The options of `lorarl tracking serve`."""
    sv.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1; beyond loopback: auth on)")
    sv.add_argument("--port", type=int, default=None, help="default 5000; 0 = any free port")
    sv.add_argument("--profile", default=None, help="bind where this profile's `tracking:` URI says")
    sv.add_argument("--state", default="results/.tracking", help="PostgreSQL data, logs, server.json")
    sv.add_argument("--artifacts", default="results/mlartifacts", help="artifact root (shared filesystem)")
    sv.add_argument("--backend-store-uri", default=None, help="an existing database instead of our own PostgreSQL")
    sv.add_argument("--workers", type=int, default=2, help="MLflow server worker processes")
    sv.add_argument("--credentials", default=None, help="credentials file (default ~/.config/lorarl/...)")
    sv.add_argument("--auth", action="store_true", help="basic auth on loopback too (a shared submit host)")
    sv.add_argument("--slurm", action="store_true", help="run it as a Slurm job (sbatch; binds 0.0.0.0, auth on); "
                    "waits until it serves, prints its URI and job id")
    sv.add_argument("--partition", default=None, help="--slurm: partition (default: the profile's slurm.tracking)")
    sv.add_argument("--time", default=None, help="--slurm: time limit, e.g. 7-0 (Slurm's syntax)")
    sv.add_argument("--cpus", type=int, default=None, help="--slurm: CPUs of the job")
    sv.add_argument("--mem-gb", type=int, default=None, help="--slurm: memory of the job (GB)")
    sv.add_argument("--sbatch", default=None, help='--slurm: more sbatch options, e.g. "--account=x --qos=y"')
    sv.add_argument("--wait", type=float, default=600, help="--slurm: seconds to wait for the job to serve")


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve in the foreground (PostgreSQL + mlflow server), or submit the server as a Slurm job and print its URI."""
    from urllib.parse import urlparse

    from lorarl.tracking.server import profile_tracking, serve

    host, port = args.host, args.port
    if args.profile:  # bind where the profile's `tracking:` URI says (flags still win)
        uri = profile_tracking(args.profile)
        if not uri or not str(uri).startswith(("http://", "https://")):
            print(f"error: profile {args.profile}: `tracking:` is {uri!r}, not an http(s):// server URI",
                  file=sys.stderr)
            return 2
        u = urlparse(uri)
        host = host or (None if args.slurm else u.hostname)  # a job's node is unknown before it starts
        port = port if port is not None else (u.port or 5000)
    if args.slurm:
        from lorarl.tracking.slurm import profile_resources, submit

        res = profile_resources(args.profile)
        res.update({k: v for k, v in (("partition", args.partition), ("time", args.time), ("cpus_per_task", args.cpus),
                                      ("mem_gb", args.mem_gb), ("sbatch", args.sbatch)) if v is not None})
        info = submit(host or "0.0.0.0", 5000 if port is None else port, args.state, args.artifacts, args.workers,
                      args.credentials, res, timeout_s=args.wait, backend=args.backend_store_uri)
        print(f"[lorarl] MLflow tracking server ready: {info['uri']} (Slurm job {info['slurm_job_id']} on "
              f"{info['host']}; stop it with `scancel {info['slurm_job_id']}`)\n"
              f"[lorarl] put this in the profile:  tracking: {info['uri']}"
              + (f"\n[lorarl] basic auth on; jobs read {info['credentials']}" if info.get("auth") else ""), flush=True)
        return 0
    return serve(host=host or "127.0.0.1", port=5000 if port is None else port, state=args.state,
                 artifacts=args.artifacts, backend=args.backend_store_uri, workers=args.workers,
                 credentials=args.credentials, force_auth=args.auth)
