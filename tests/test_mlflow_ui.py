"""The study in MLflow's real UI (3.17), in headless chromium with a fresh profile: the experiment link lorarl
gives (report.html; lorarl.report.mlflow_links) opens the study's runs table, the study run and its cell in it.
The UI takes its view from the address's `workflowType`, else from the browser's remembered sidebar switch
(GenAI on a fresh browser); the experiment's `mlflow.experimentKind` tag alone still lands on the GenAI overview,
which the second visit shows (docs/tracking.md says so: if a later MLflow reads the tag, this test says so)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.cdp import Pipe, chromium
from lorarl.report.mlflow_links import experiment_url
from lorarl.tracking import client as tracking
from lorarl.tracking.client import KIND, KIND_TAG, Tracker

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium() is None, reason="needs chromium (scripts/chromium.sh)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visit(url: str, timeout_s: float = 60) -> dict:
    """Open `url` in a fresh browser profile; poll until the page shows a runs table with its runs or the GenAI
    overview (or the time is up), then once more a second later: the final address (its #fragment) and the text."""
    with tempfile.TemporaryDirectory() as profile:
        pipe = Pipe(chromium(), profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            pipe.send("Page.enable", session=sid)
            pipe.send("Page.navigate", {"url": url}, session=sid)
            pipe.wait_event("Page.loadEventFired")
            end, settled = time.time() + timeout_s, 0
            while time.time() < end and settled < 2:
                time.sleep(0.5)
                got = pipe.send("Runtime.evaluate", {"expression": "JSON.stringify({hash: location.hash, text: "
                                                     "document.body.innerText})", "returnByValue": True}, session=sid)
                seen = json.loads(got["result"]["value"])
                # "0 matching runs" is the table before its runs arrive (a loaded machine): not settled yet
                settled += bool(re.search(r"\b[1-9]\d* matching runs?", seen["text"])) or "Overview" in seen["text"]
            return seen
        finally:
            pipe.close()


def test_the_study_link_opens_the_runs_table_in_a_fresh_browser(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    results = tmp_path / "results"
    t = Tracker(results, "uistudy")
    t.start("r8-s0", "r8-s0", {}, {})
    t.finish()
    assert t.client.get_experiment(t.experiment_id).tags[KIND_TAG] == KIND
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{results / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.time() < end, "mlflow server did not start"
                time.sleep(0.5)
        link = experiment_url({"base": base, "experiment_id": t.experiment_id})
        page = visit(link)  # the runs table: the study run (its cell nested under it, collapsed), 2 runs in all
        assert page["hash"].startswith(f"#/experiments/{t.experiment_id}/runs"), page["hash"]
        rows = page["text"].split("Run Name", 1)[-1]
        assert "Run Name" in page["text"] and "uistudy" in rows and "2 matching runs" in rows, page["text"][:2000]
        assert "Overview" not in page["text"]
        bare = visit(f"{base}/#/experiments/{t.experiment_id}")  # the experiment, tagged, without the view
        assert "Overview" in bare["text"] and "matching run" not in bare["text"], bare["text"][:2000]
    finally:
        server.terminate()
        server.wait(30)
