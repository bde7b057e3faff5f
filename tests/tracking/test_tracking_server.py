"""The MLflow tracking server of `lorarl tracking serve` (PostgreSQL backend, basic auth): an unauthenticated
request is refused and the password is in no process's argv or environment; bound to this machine's
non-loopback interface, auth comes on by itself and a writer process authenticates from the 0600 file
alone; 8 concurrent writer processes (synthetic metrics through lorarl's Tracker, not 8 trainings: 2
cores) lose and double nothing; the demo-sized pipeline (2 real cells) runs against it while the whole
server (MLflow + PostgreSQL) is SIGKILLed mid-training and restarted, and finishes with every (metric,
step) of metrics.csv in MLflow exactly once and report.html linking to the server's runs."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support.study import TRAIN, tiny_study

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.tracking import ServerProcess, count_rows, run_writers  # noqa: E402

from lorarl.report.mlflow_links import VIEW  # noqa: E402
from lorarl.tracking import client as tracking, server as tracking_server  # noqa: E402
from lorarl.tracking import credentials as tracking_credentials

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    root = Path(tempfile.mkdtemp(prefix="lorarl-trk-", dir="/tmp"))
    os.chmod(root, 0o711)  # as root, PostgreSQL runs as `postgres` and must traverse it
    srv = ServerProcess(root, auth=True)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(server, monkeypatch):
    import mlflow

    creds = tracking_credentials.load_credentials(server.creds)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", creds["username"])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", creds["password"])
    return mlflow.MlflowClient(server.uri)


def _get(url: str, auth: tuple[str, str] | None = None) -> int:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_server_refuses_unauthenticated_requests_and_hides_its_secret(server):
    assert server.uri.startswith("http://127.0.0.1:")
    url = f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1"
    creds = tracking_credentials.load_credentials(server.creds)
    assert _get(url) == 401
    assert _get(url, (creds["username"], "wrong-password")) == 401
    assert _get(url, (creds["username"], creds["password"])) == 200
    info = json.loads((server.state / "server.json").read_text())
    assert info["auth"] is True and info["backend"] == "postgresql (own)"
    # the password is on no command line and in no environment (`ps`, `ps e`): only in 0600 files
    assert showing(creds["password"]) == []
    assert oct((server.state / "basic_auth.ini").stat().st_mode & 0o777) == "0o600"
    group = group_commands(server.proc.pid)  # the server's processes: MLflow and PostgreSQL, no job workers
    assert any("mlflow" in c and "server" in c for c in group) and not [c for c in group if "huey" in c], group


def group_commands(pgid: int) -> list[str]:
    """Command lines of the processes in process group `pgid`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[2]) == pgid:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):
            continue
    return found


def showing(secret: str) -> list[str]:
    """Processes whose command line or environment (what `ps`/`ps e` show) contain `secret`."""
    found = []
    for proc in Path("/proc").iterdir():
        for what in ("cmdline", "environ"):
            try:
                if secret.encode() in (proc / what).read_bytes():
                    found.append(f"{proc.name} {what}: {(proc / 'cmdline').read_bytes()[:200]!r}")
            except OSError:
                continue
    return found


def test_beyond_loopback_auth_is_on_and_a_job_authenticates_from_the_file(tmp_path: Path, monkeypatch):
    """Bound to this machine's non-loopback interface, without --auth: auth is on by itself; a request
    without (or with wrong) credentials gets 401; a writer process given only the credentials file's
    path authenticates, its metrics land, and the password is in no process's argv or environment
    (the writer's, its child's, the server's)."""
    import mlflow

    addrs = tracking_server.interface_addresses()
    if not addrs:
        pytest.skip("this machine has no non-loopback interface address (`ip -o addr`): nothing to bind beyond loopback")
    addr = sorted(addrs, key=lambda a: ":" in a)[0]  # IPv4 first
    root = Path(tempfile.mkdtemp(prefix="lorarl-trk-nl-", dir="/tmp"))
    os.chmod(root, 0o711)
    srv = ServerProcess(root, auth=False, host=addr)
    hold = root / "hold"
    writer = None
    try:
        srv.start()
        host = f"[{addr}]" if ":" in addr else addr
        assert srv.uri == f"http://{host}:{srv.port}"
        info = json.loads((srv.state / "server.json").read_text())
        assert info["auth"] is True and info["bind"] == addr and info["credentials"] == str(srv.creds)
        assert oct(srv.creds.stat().st_mode & 0o777) == "0o600"
        url = f"{srv.uri}/api/2.0/mlflow/experiments/search?max_results=1"
        creds = tracking_credentials.load_credentials(srv.creds)
        assert _get(url) == 401
        assert _get(url, (creds["username"], "not-the-password")) == 401
        assert _get(url, (creds["username"], creds["password"])) == 200
        hold.write_text("")
        env = {**srv.env(), tracking.TRACKING_ENV: srv.uri, "LORARL_TEST_HOLD": str(hold)}
        assert not any(k.startswith("MLFLOW_TRACKING_") for k in env)  # only the file's path
        writer = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "tracking.py"), str(tmp_path),
                                   "nonloop", "w0", "5", str(root / "go")], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        (root / "go").write_text("go")
        deadline = time.monotonic() + 300
        while not Path(f"{hold}.w0.ready").exists():  # metrics logged; writer and its child alive
            assert writer.poll() is None, writer.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert showing(creds["password"]) == []
        hold.unlink()
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-3000:]
        run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", creds["username"])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", creds["password"])
        client = mlflow.MlflowClient(srv.uri)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.tags["lorarl.cell_id"] == "w0"
        assert [m.step for m in client.get_metric_history(run_id, "reward")] == [1, 2, 3, 4, 5]
    finally:
        hold.unlink(missing_ok=True)
        if writer is not None and writer.poll() is None:
            writer.kill()
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_eight_concurrent_writers_server(server, client, tmp_path: Path):
    env = {**server.env(), tracking.TRACKING_ENV: server.uri}
    reports = run_writers(8, tmp_path, "conc", steps=12, env=env)
    assert len(reports) == 8
    rows = count_rows(client, "conc", 8, 12)
    assert rows["runs"] == 8 and rows["finished"] == 8 and set(rows["cells"].values()) == {1}
    assert rows["lost"] == 0 and rows["duplicated"] == 0


STUDY = tiny_study("srv", train={**TRAIN, "steps": 6, "checkpoint_every": 2})


def _progress(res: Path) -> int:
    steps = [json.loads(p.read_text()).get("step", 0) for p in res.glob("srv/.checkpoints/*/progress.json")
             if p.stat().st_size]
    return max(steps, default=0)


def _failure_logs(wd: Path) -> str:
    out = [(wd / "snakemake.log").read_text()[-3000:]]
    for f in sorted((wd / "results").glob("srv/*/logs/**/*")):
        if f.is_file() and f.suffix in (".log", ".err"):
            out.append(f"--- {f}\n" + f.read_text(errors="replace")[-2500:])
    return "\n".join(out)


def test_pipeline_on_the_server_survives_a_server_kill(server, client, tmp_path: Path, tiny_test_base: Path):
    from tests.support.trained import place_base

    wd = tmp_path
    place_base(tiny_test_base, wd / "results")  # the session's base model: no base_model job here
    (wd / "study.yaml").write_text(yaml.safe_dump(STUDY))
    (wd / "config.yaml").write_text(yaml.safe_dump({
        "studies": [str(wd / "study.yaml")], "results": "results", "launcher": "local", "slurm": {},
        "tracking": server.uri, "tracking_credentials": str(server.creds)}))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(wd),
           "--configfile", str(wd / "config.yaml"), "--cores", "2"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           tracking.RETRY_ENV: "400"}  # the restart below takes a while on 2 busy cores
    for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", tracking.TRACKING_ENV):
        env.pop(k, None)
    log = open(wd / "snakemake.log", "w")
    proc = subprocess.Popen(cmd, cwd=wd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 900
        while _progress(wd / "results") < 1:  # a cell is training: the whole server dies
            assert proc.poll() is None, (wd / "snakemake.log").read_text()[-4000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        server.kill()
        time.sleep(5)
        server.start()
        assert proc.wait(timeout=900) == 0, _failure_logs(wd)
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = "".join(p.read_text(errors="replace") for p in (wd / "results" / "srv").glob("*/logs/**/*.err"))
    assert "training goes on" in logs  # the outage was seen during training, not only between jobs
    for cell in ("s0", "s1"):
        cdir = wd / "results" / "srv" / cell
        run_id = json.loads((cdir / "summary.json").read_text())["mlflow_run_id"]
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.info.lifecycle_stage == "active"
        csv = pd.read_csv(cdir / "metrics.csv")
        assert list(csv["step"]) == [1, 2, 3, 4, 5, 6]
        for col in csv.columns.drop("step"):
            want = [(int(s), float(v)) for s, v in zip(csv["step"], csv[col]) if pd.notna(v)]
            got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, col))
            assert [s for s, _ in got] == [s for s, _ in want], col  # every (metric, step) exactly once
            assert [v for _, v in got] == pytest.approx([v for _, v in want]), col  # the same values
        assert [m.step for m in client.get_metric_history(run_id, "eval/synthetic/pass_at_1")] == [6]
        exp = client.get_experiment_by_name("srv")
        assert len(client.search_runs([exp.experiment_id], f"tags.`lorarl.cell_id` = '{cell}'")) == 1
        # report.html links to the server's UI (from the tracking setting), with the experiment id it looked up
        report = (wd / "results" / "srv" / "report.html").read_text()
        assert f'href="{server.uri}/#/experiments/{exp.experiment_id}/runs/{run_id}{VIEW}"' in report
