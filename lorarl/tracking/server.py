"""`lorarl tracking serve`: an MLflow tracking server on PostgreSQL, for many cells on many nodes.

    lorarl tracking serve [--host 127.0.0.1] [--port 5000] [--state results/.tracking] [--artifacts DIR]
                          [--profile profiles/slurm] [--backend-store-uri postgresql://...] [--workers 2]

- Backend store: by default a PostgreSQL instance of its own (initdb on first use) in <state>/postgres,
  reachable only through a unix socket in a 0700 folder (no TCP port: nobody else on the host can
  connect); or any database URI given with --backend-store-uri (a site PostgreSQL/MariaDB).
- Artifacts: --artifacts (default results/mlartifacts, the shared filesystem), written there directly
  by the jobs (`--default-artifact-root`, no proxying).
- Binding: loopback (127.0.0.1) unless --host (or the `tracking:` URI of --profile) names another
  interface. Beyond loopback MLflow's basic-auth app is on: the admin user's name and password come
  from the credentials file (created with a random password on first use, mode 0600), handed to the
  server through a 0600 config file, never a command line or an environment that `ps` shows.
- Prints the URI to put in the profile (`tracking:`) and writes <state>/server.json (no secrets).
  Runs in the foreground until SIGTERM/SIGINT (then stops MLflow and PostgreSQL): on the submit host,
  or as a small Slurm job (`lorarl tracking serve --slurm`, lorarl.tracking.slurm; the job's node name
  is in the printed URI and in server.json on the shared filesystem).

Jobs: `lorarl.tracking.credentials.configure_client` reads the credentials file (refused unless only its owner can read it) and
hands user and password to MLflow's REST client of that server inside the process (not its
environment: children and `ps e` never see them); it turns MLflow's own HTTP retries off:
lorarl.tracking.client retries with its own backoff and keeps training while the server is away.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from lorarl.tracking.errors import TrackingError
from lorarl.tracking.credentials import credentials_path, is_loopback, write_credentials

PG_USER, PG_PORT = "lorarl", 5432  # the socket file is <sockdir>/.s.PGSQL.5432; no TCP listener
DATABASES = ("mlflow", "mlflow_auth")


# ---- PostgreSQL of our own ----------------------------------------------------------------------------
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
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def profile_tracking(profile: str | Path) -> str | None:
    """The `tracking:` value of a profile folder (its config.yaml and the config files it names)."""
    import yaml

    root = Path(profile)
    found = None
    for name in ("config.yaml", "cluster.yaml"):
        f = root / name
        if f.exists():
            doc = yaml.safe_load(f.read_text()) or {}
            found = doc.get("tracking", found) if isinstance(doc, dict) else found
    return found


def node_name() -> str:
    """This node's name as other nodes reach it: the FQDN, unless it only resolves to loopback here."""
    fqdn = socket.getfqdn()
    return socket.gethostname() if fqdn in ("localhost", "localhost.localdomain") or "." not in fqdn else fqdn


def public_uri(host: str, port: int) -> str:
    name = node_name() if host in ("0.0.0.0", "::") else host
    return f"http://{'[' + name + ']' if ':' in name else name}:{port}"


def interface_addresses(include_loopback: bool = False) -> list[str]:
    """This node's IP addresses (`ip -o addr`; else the one the default route leaves from), global first."""
    found: list[str] = []
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if Path(p).exists()), None)
    if ip:
        out = subprocess.run([ip, "-o", "addr", "show"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] in ("inet", "inet6") and "scope link" not in line:
                found.append(parts[3].split("/")[0])
    if not found:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("192.0.2.1", 9))  # no packet is sent: the kernel only picks a source address
                found.append(s.getsockname()[0])
        except OSError:
            pass
    found = list(dict.fromkeys(found))
    return found if include_loopback else [a for a in found if not is_loopback(a)]


def server_command(backend: str, artifacts: Path, host: str, port: int, workers: int, auth: bool) -> list[str]:
    """`mlflow server ...`; allowed Host headers: this node's names and addresses with the port."""
    names = ["localhost", "127.0.0.1", host, socket.gethostname(), socket.getfqdn(), node_name()]
    if host in ("0.0.0.0", "::"):
        names += interface_addresses()
    named = [f"[{n}]" if ":" in n else n for n in names]
    allowed = ",".join(dict.fromkeys(named + [f"{n}:{port}" for n in named]))
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
           "--default-artifact-root", str(artifacts), "--no-serve-artifacts", "--host", host, "--port", str(port),
           "--workers", str(workers), "--allowed-hosts", allowed]
    return cmd + (["--app-name", "basic-auth"] if auth else [])


def wait_http(uri: str, proc: subprocess.Popen | None = None, timeout_s: float = 300, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log and log.exists() else ""
            raise TrackingError(f"mlflow server exited with status {proc.returncode} before answering on {uri}"
                                + (f"; the end of {log}:\n{tail}" if tail else ""))
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TrackingError(f"mlflow server did not answer on {uri}/health within {timeout_s:.0f} s")
        time.sleep(0.3)


def _secret_key(path: Path) -> str:
    """The basic-auth app's CSRF key: random once, kept (mode 0600) so restarts keep sessions valid."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def serve(host: str = "127.0.0.1", port: int = 5000, state: str | Path = "results/.tracking",
          artifacts: str | Path = "results/mlartifacts", backend: str | None = None, workers: int = 2,
          credentials: str | Path | None = None, force_auth: bool = False, ready: Any = None) -> int:
    """Start PostgreSQL (unless `backend`) and `mlflow server`; block until signalled. Returns the exit code."""
    state, artifacts = Path(state).resolve(), Path(artifacts).resolve()
    state.mkdir(parents=True, exist_ok=True, mode=0o711 if os.geteuid() == 0 else 0o700)  # root: postgres traverses
    artifacts.mkdir(parents=True, exist_ok=True)
    port = free_port(host) if port == 0 else port
    auth = force_auth or not is_loopback(host)  # loopback is shared by every user of a host: --auth
    pg = None if backend else Postgres(state / "postgres")
    env = {**os.environ}
    # MLflow's server-side jobs (GenAI evaluation and prompt optimisation: lorarl runs none) start Huey worker
    # processes that each import MLflow; off unless the environment turns them on
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    mlflow_proc: subprocess.Popen | None = None
    stopping = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if pg is not None:
            pg.start()
            backend = pg.uri("mlflow")
        if auth:
            creds = write_credentials(credentials)
            ini = state / "basic_auth.ini"
            auth_db = pg.uri("mlflow_auth") if pg is not None else f"sqlite:///{state / 'basic_auth.db'}"
            ini.unlink(missing_ok=True)  # created 0600 below, never widened by an older file's mode
            fd = os.open(ini, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:  # the password in a 0600 file, never argv or environment
                fh.write(f"[mlflow]\ndefault_permission = NO_PERMISSIONS\ndatabase_uri = {auth_db}\n"
                         f"admin_username = {creds['username']}\nadmin_password = {creds['password']}\n"
                         f"authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                         f"auth_cache_ttl_seconds = 60\n")  # PBKDF2 once a minute per user, not per request
            for k in ("MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"):  # would override the file
                env.pop(k, None)
            # the CSRF key of the UI's forms (not a credential): MLflow reads it from the environment only
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini),
                       MLFLOW_FLASK_SERVER_SECRET_KEY=_secret_key(state / "flask-secret"))
        cmd = server_command(backend, artifacts, host, port, workers, auth)
        log = state / "mlflow-server.log"
        mlflow_proc = subprocess.Popen(cmd, env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT)
        local = f"http://{'127.0.0.1' if host in ('0.0.0.0', 'localhost') else host}:{port}"
        wait_http(local if ":" not in host else f"http://[{host}]:{port}", mlflow_proc, log=log)
        uri = public_uri(host, port)
        info = {"uri": uri, "host": socket.gethostname(), "bind": host, "port": port, "pid": os.getpid(),
                "auth": auth, "backend": "postgresql (own)" if pg else "external", "artifacts": str(artifacts),
                "credentials": str(credentials_path(credentials)) if auth else None, "started": time.time(),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
        tmp = state / "server.json.tmp"
        tmp.write_text(json.dumps(info, indent=1) + "\n")
        os.replace(tmp, state / "server.json")
        print(f"[lorarl] MLflow tracking server ready: {uri}\n[lorarl] put this in the profile:  tracking: {uri}"
              + (f"\n[lorarl] basic auth on; jobs read {credentials_path(credentials)}" if auth else ""), flush=True)
        if ready is not None:
            ready(info)
        mlflow_proc.wait()
        print(f"[lorarl] mlflow server exited ({mlflow_proc.returncode}); see {state / 'mlflow-server.log'}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if mlflow_proc is not None and mlflow_proc.poll() is None:
            mlflow_proc.terminate()
            try:
                mlflow_proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                mlflow_proc.kill()
        if pg is not None:
            pg.stop()
        for s, h in previous.items():
            signal.signal(s, h)
