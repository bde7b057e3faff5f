"""A private PostgreSQL cluster for `lorarl tracking serve` (MLflow's backend and auth stores): initdb,
start, stop, run as the `postgres` user when lorarl runs as root."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from lorarl.tracking.errors import TrackingError

PG_USER, PG_PORT = "lorarl", 5432  # the socket file is <sockdir>/.s.PGSQL.5432; no TCP listener
DATABASES = ("mlflow", "mlflow_auth")  # MLflow's tracking and auth stores


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if versions:
        return str(versions[-1])
    raise TrackingError(f"PostgreSQL's `{name}` was not found: install PostgreSQL (Debian: apt-get install "
                        f"postgresql; scripts/test.sh does) or give --backend-store-uri")


def _pg_user() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` system user."""
    return {"user": "postgres", "group": "postgres", "extra_groups": []} if os.geteuid() == 0 else {}


def _own_for_pg(path: Path) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam("postgres")
    os.chown(path, pw.pw_uid, pw.pw_gid)
    probe = subprocess.run(["test", "-w", str(path)], capture_output=True, **_pg_user())
    if probe.returncode != 0:
        raise TrackingError(f"--state {path.parent}: as root, PostgreSQL runs as user `postgres`, which cannot "
                            f"reach {path}; choose a state folder whose parents it can traverse")


class Postgres:
    """A private PostgreSQL cluster in <root>: data/ and a 0700 socket folder sock/."""

    def __init__(self, root: Path):
        self.root = root
        self.data, self.sock = root / "data", root / "sock"
        self.proc: subprocess.Popen | None = None

    def uri(self, db: str = "mlflow") -> str:
        return f"postgresql://{PG_USER}@/{db}?host={self.sock}&port={PG_PORT}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.data, self.sock):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
            _own_for_pg(d)
        if not (self.data / "PG_VERSION").exists():
            proc = subprocess.run([_pg_bin("initdb"), "-D", str(self.data), "-U", PG_USER, "-E", "UTF8",
                                   "--auth-local=trust", "--auth-host=reject"], capture_output=True, text=True,
                                  cwd=self.root, **_pg_user())
            if proc.returncode != 0:
                raise TrackingError(f"initdb {self.data} failed:\n{proc.stderr[-2000:]}")
        log = open(self.root / "postgres.log", "a")
        self.proc = subprocess.Popen([_pg_bin("postgres"), "-D", str(self.data), "-k", str(self.sock), "-p",
                                      str(PG_PORT), "-c", "listen_addresses=", "-c", "max_connections=200"],
                                     stdout=log, stderr=subprocess.STDOUT, cwd=self.root, **_pg_user())
        self._wait_ready()
        for db in DATABASES:
            self._ensure_db(db)

    def _connect(self, db: str) -> Any:
        import psycopg2

        return psycopg2.connect(dbname=db, user=PG_USER, host=str(self.sock), port=PG_PORT)

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise TrackingError(f"PostgreSQL exited ({self.proc.returncode}); see {self.root / 'postgres.log'}")
            try:
                self._connect("postgres").close()
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise TrackingError(f"PostgreSQL not ready after {timeout_s:.0f} s; see "
                                        f"{self.root / 'postgres.log'}") from None
                time.sleep(0.2)

    def _ensure_db(self, db: str) -> None:
        conn = self._connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{db}"')
        conn.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # "fast" shutdown: roll back open transactions, checkpoint
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ---- the MLflow server --------------------------------------------------------------------------------
