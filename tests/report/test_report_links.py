"""report.html's MLflow links follow the tracking setting (lorarl.report.mlflow_links): sqlite -> `mlflow
ui`'s address + the command; a server URI (setting, or results/.tracking/server.json) -> the server, its
experiment id looked up with the credentials file's basic auth; $LORARL_MLFLOW_UI overrides the address.
The server here is a stub HTTP endpoint that checks the Authorization header (the real server's
answer to the same request: tests/tracking/test_tracking_server.py's pipeline test checks the links)."""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from lorarl.tracking import client as tracking, credentials as tracking_credentials
from lorarl.report import html
from lorarl.report.mlflow_links import UI_ENV, VIEW, run_url, ui_target

CREDS = {"username": "lorarl", "password": "s3cret-pw"}


@pytest.fixture
def stub(monkeypatch):
    """An MLflow-like get-by-name endpoint: 401 without the right basic auth, else experiment 42."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            want = "Basic " + base64.b64encode(f"{CREDS['username']}:{CREDS['password']}".encode()).decode()
            url = urlparse(self.path)
            seen.append((url.path, parse_qs(url.query), self.headers.get("Authorization")))
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"experiment": {"experiment_id": "42", "name": parse_qs(url.query)["experiment_name"][0]}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    for k in (tracking.TRACKING_ENV, UI_ENV, tracking_credentials.CREDENTIALS_ENV, "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()


def _creds_file(tmp_path: Path, password: str = CREDS["password"]) -> Path:
    f = tmp_path / "creds"
    f.write_text(f"username = lorarl\npassword = {password}\n")
    f.chmod(0o600)
    return f


def test_sqlite_links_point_to_mlflow_ui_with_the_experiment(tmp_path: Path, stub):
    res = tmp_path / "results"
    t = tracking.Tracker(res, "lk", tracking="sqlite")
    run = t.start("c0", "c0", tags={}, params={})
    target = ui_target(res, "lk")
    assert target["base"] == "http://127.0.0.1:5000" and target["experiment_id"] == t.experiment_id
    # the command that starts the UI where the links point, its address spelled out (no port of the UI's choosing)
    assert (f"mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///{res.resolve()}/mlflow.db"
            in target["hint"])
    # every link carries the model-training view: MLflow 3.17 opens the runs, not the GenAI overview (test_mlflow_ui.py)
    assert run_url(target, run) == f"http://127.0.0.1:5000/#/experiments/{t.experiment_id}/runs/{run}{VIEW}"
    line = html.mlflow_line(target, "lk")  # its one link: the runs table (the UI's home would open on GenAI)
    assert re.findall(r'href="([^"]+)"', line) == [f"http://127.0.0.1:5000/#/experiments/{t.experiment_id}/runs{VIEW}"]
    assert "mlflow ui" in line and " at http://127.0.0.1:5000 " in line
    no_exp = html.mlflow_line(ui_target(res, "other"), "other")  # no experiment yet: the UI itself
    assert re.findall(r'href="([^"]+)"', no_exp) == ["http://127.0.0.1:5000"]


def test_server_setting_links_to_the_server_with_its_experiment_id(tmp_path: Path, stub, monkeypatch):
    uri, seen = stub
    monkeypatch.setenv(tracking.TRACKING_ENV, uri)
    monkeypatch.setenv(tracking_credentials.CREDENTIALS_ENV, str(_creds_file(tmp_path)))
    target = ui_target(tmp_path / "results", "my study")
    assert target == {"base": uri, "experiment_id": "42", "source": "tracking setting", "hint": ""}
    assert seen[-1][0] == "/api/2.0/mlflow/experiments/get-by-name" and seen[-1][1] == {"experiment_name": ["my study"]}
    assert run_url(target, "abc123") == f"{uri}/#/experiments/42/runs/abc123{VIEW}"
    assert html.run_link(target, "abc123def") == f'<a href="{uri}/#/experiments/42/runs/abc123def{VIEW}">abc123de</a>'
    # wrong password: the server refuses (401), so no experiment id: the UI's direct run route
    monkeypatch.setenv(tracking_credentials.CREDENTIALS_ENV, str(_creds_file(tmp_path, "wrong")))
    target = ui_target(tmp_path / "results", "my study")
    assert target["experiment_id"] is None and run_url(target, "abc") == f"{uri}/#/runs/abc{VIEW}"
    # a server that is gone: the same, without waiting long
    monkeypatch.setenv(tracking.TRACKING_ENV, "http://127.0.0.1:9")
    assert ui_target(tmp_path / "results", "my study")["experiment_id"] is None


def test_server_json_without_a_setting_and_the_ui_override(tmp_path: Path, stub, monkeypatch):
    uri, _ = stub
    res = tmp_path / "results"
    (res / ".tracking").mkdir(parents=True)
    (res / ".tracking" / "server.json").write_text(json.dumps({"uri": uri, "auth": True}))
    monkeypatch.setenv(tracking_credentials.CREDENTIALS_ENV, str(_creds_file(tmp_path)))
    target = ui_target(res, "s")
    assert target["base"] == uri and target["experiment_id"] == "42" and "server.json" in target["source"]
    monkeypatch.setenv(tracking.TRACKING_ENV, "sqlite")  # an explicit sqlite setting wins over server.json
    assert ui_target(res, "s")["base"] == "http://127.0.0.1:5000"
    monkeypatch.setenv(tracking.TRACKING_ENV, uri)
    monkeypatch.setenv(UI_ENV, "http://localhost:15000/")  # e.g. an SSH port-forward to the server
    target = ui_target(res, "s")
    assert target["base"] == "http://localhost:15000" and target["experiment_id"] == "42"
    assert target["source"] == f"${UI_ENV}"


def test_the_configured_ui_and_mlflow_tracking_uri_set_the_links_and_status_prints_one(tmp_path: Path, stub,
                                                                                       monkeypatch, capsys):
    """Issue 46 item 5: the links use what the user configured: `$MLFLOW_TRACKING_URI` (a server, as the client reads
    it when no lorarl setting is given), `--mlflow-ui` (report, aggregate, status; the profile's `mlflow_ui:`);
    `lorarl status` prints the study's runs-table link."""
    from lorarl import cli

    uri, _ = stub
    monkeypatch.setenv(tracking_credentials.CREDENTIALS_ENV, str(_creds_file(tmp_path)))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    target = ui_target(tmp_path / "results", "st")
    assert target["base"] == uri and target["experiment_id"] == "42" and target["hint"] == ""
    monkeypatch.setenv(tracking.TRACKING_ENV, "sqlite")  # lorarl's own setting wins, as in the client
    assert ui_target(tmp_path / "results", "st")["base"] == "http://127.0.0.1:5000"
    study = tmp_path / "st.yaml"
    study.write_text("name: st\ndefaults: {model: 'local:tiny-test'}\naxes: {seed: {field: seed, prefix: s, "
                     "values: [0]}}\n")
    res = str(tmp_path / "results")
    assert cli.main(["status", str(study), "--results", res, "--tracking", uri, "--mlflow-ui",
                     "http://localhost:15000/"]) == 0
    assert f"\nMLflow: http://localhost:15000/#/experiments/42/runs{VIEW}\n" in capsys.readouterr().out
    monkeypatch.delenv(UI_ENV)
    assert cli.main(["status", str(study), "--results", res, "--mlflow-ui", "localhost:15000"]) == 2
    assert "--mlflow-ui 'localhost:15000': not an address; allowed: http(s)://" in capsys.readouterr().err
    assert cli.main(["status", str(study), "--results", res, "--tracking", "sqlite"]) == 0  # no store yet
    assert ("\nMLflow: no experiment 'st' at http://127.0.0.1:5000 yet (from sqlite (results/mlflow.db))\n"
            in capsys.readouterr().out)
