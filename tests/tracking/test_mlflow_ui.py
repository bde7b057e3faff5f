"""The study in MLflow's real UI (3.17), in headless chromium with a fresh profile: the links lorarl gives
(report.html's and `lorarl status`'s; lorarl.report.mlflow_links) open the study's runs table and the cell's run,
whatever the UI's stored choice. The UI takes its view from the address's `workflowType`, else from the browser's
remembered sidebar switch (local storage `mlflow.workflowType_v1`; GenAI on a fresh browser); the experiment's
`mlflow.experimentKind` tag alone still lands on the GenAI overview, which the bare address shows (docs/tracking.md
says so: if a later MLflow reads the tag, this test says so). MLflow issue #24498."""

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
from html import unescape
from pathlib import Path

import mlflow
import pytest

from tests.support.cdp import Pipe, chromium
from lorarl import cli
from lorarl.report import html
from lorarl.report.mlflow_links import experiment_url, run_url, ui_target
from lorarl.tracking import client as tracking
from lorarl.tracking.client import KIND, KIND_TAG, Tracker

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium() is None, reason="needs chromium (scripts/chromium.sh)")]

STORED = "mlflow.workflowType_v1"  # the UI's useLocalStorage key (`${key}_v${version}`) of its sidebar switch
GENAI = json.dumps("genai")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runs_table(text: str) -> bool:
    # "0 matching runs" is the table before its runs arrive (a loaded machine): not settled yet
    return bool(re.search(r"\b[1-9]\d* matching runs?", text)) or "Overview" in text


def visit(url: str, settled, stored: str | None = None, timeout_s: float = 60) -> dict:
    """Open `url` in a fresh browser profile (its local storage empty, or the UI's switch set to `stored` before the
    page's scripts run); poll until `settled(text)` holds (or the time is up), then once more: the final address
    (its #fragment), the text and the stored switch after the visit."""
    with tempfile.TemporaryDirectory() as profile:
        pipe = Pipe(chromium(), profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            pipe.send("Page.enable", session=sid)
            if stored is not None:
                pipe.send("Page.addScriptToEvaluateOnNewDocument",
                          {"source": f"localStorage.setItem({STORED!r}, {stored!r})"}, session=sid)
            pipe.send("Page.navigate", {"url": url}, session=sid)
            pipe.wait_event("Page.loadEventFired")
            end, done = time.time() + timeout_s, 0
            while time.time() < end and done < 2:
                time.sleep(0.25)
                expression = ("JSON.stringify({hash: location.hash, text: document.body.innerText, "
                              f"stored: localStorage.getItem({STORED!r})}})")
                got = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=sid)
                seen = json.loads(got["result"]["value"])
                done += bool(settled(seen["text"]))
            return seen
        finally:
            pipe.close()


def test_the_report_and_status_links_open_the_runs_table_whatever_the_stored_choice(tmp_path: Path, monkeypatch,
                                                                                    capsys):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    assert any('key:"mlflow.workflowType",version:1' in f.read_text(errors="ignore") for f in bundle.glob("main.*.js"))
    results = tmp_path / "results"
    t = Tracker(results, "uistudy")
    run_id = t.start("r8-s0", "r8-s0", {}, {})
    t.finish()
    assert t.client.get_experiment(t.experiment_id).tags[KIND_TAG] == KIND
    study = tmp_path / "uistudy.yaml"
    study.write_text("name: uistudy\ndefaults: {model: 'local:tiny-test'}\naxes: {seed: {field: seed, prefix: s, "
                     "values: [0]}}\n")
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
        # the links as lorarl writes them for a store served at `base` (the tracking setting: the server's UI):
        # `lorarl status`'s line, and report.html's study link and cell link (lorarl.report.html writes them)
        assert cli.main(["status", str(study), "--results", str(results), "--tracking", base]) == 0
        status_link = re.search(r"^MLflow: (\S+)$", capsys.readouterr().out, re.M).group(1)
        monkeypatch.setenv(tracking.TRACKING_ENV, base)
        target = ui_target(results, "uistudy")
        report_study, report_cell = [unescape(h) for h in re.findall(
            r'href="([^"]+)"', html.mlflow_line(target, "uistudy") + html.run_link(target, run_id))]
        assert status_link == report_study == experiment_url(target) and target["experiment_id"] == t.experiment_id
        assert report_cell == run_url(target, run_id)
        for stored in (None, GENAI):  # a fresh browser; one whose sidebar switch was left on GenAI
            page = visit(status_link, runs_table, stored)
            assert page["hash"].startswith(f"#/experiments/{t.experiment_id}/runs"), page["hash"]
            # the runs table's own counter (its grid's header may still be drawing when the page is read)
            assert "uistudy" in page["text"] and "2 matching runs" in page["text"], page["text"][:2000]
            assert "Overview" not in page["text"] and page["stored"] == stored  # the link left the choice alone
            cell = visit(report_cell, lambda text: "r8-s0" in text and "Parameters" in text, stored)
            assert cell["hash"].startswith(f"#/experiments/{t.experiment_id}/runs/{run_id}"), cell["hash"]
            assert "r8-s0" in cell["text"] and "Parameters" in cell["text"], cell["text"][:2000]
            assert cell["stored"] == stored
        bare = visit(f"{base}/#/experiments/{t.experiment_id}", runs_table)  # the tagged experiment, no view named
        assert "Overview" in bare["text"] and "matching run" not in bare["text"], bare["text"][:2000]
    finally:
        server.terminate()
        server.wait(30)
