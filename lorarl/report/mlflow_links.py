"""Where the report's and `lorarl status`'s MLflow links point: the UI of the store that holds the study's runs.

The UI's address, first match wins (never a port of our own choosing):
1. the UI address the user configured: `--mlflow-ui` (`lorarl report/aggregate/status`; the aggregate rule
   passes the profile's `mlflow_ui:`), else `$LORARL_MLFLOW_UI` (e.g. an SSH port-forward);
2. the tracking setting when it is a server URI (a tracking server is its own UI): `--tracking` (the aggregate
   rule passes the profile's `tracking:`; `$LORARL_TRACKING` in a job), else `$MLFLOW_TRACKING_URI`, as the
   client reads them (lorarl.tracking.client.resolve_tracking);
3. with no setting at all, `<results>/.tracking/server.json` (written by `lorarl tracking serve`);
4. sqlite with no UI configured: the address `mlflow ui` serves by default, and the command that starts it there
   over results/mlflow.db, host and port spelled out.
The experiment id comes from the store (sqlite read-only; a server: one GET with the credentials file's
basic auth, 5 s at most). Unknown, a run's link uses the UI's direct route `#/runs/<run id>`.
Every link names the model-training view (`VIEW`), so it opens on the runs table whatever the browser remembers.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

UI_ENV = "LORARL_MLFLOW_UI"
SQLITE_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves unless told otherwise (the hint's command says so)


def sqlite_experiment_id(results: Path, study: str) -> str | None:
    db = results / "mlflow.db"
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            row = con.execute("select experiment_id from experiments where name = ?", (study,)).fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


def server_experiment_id(uri: str, study: str, timeout_s: float = 5.0) -> str | None:
    """The experiment id of `study` on a tracking server (basic auth from the credentials file if any)."""
    from lorarl.tracking.credentials import load_credentials

    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?" + urllib.parse.urlencode(
        {"experiment_name": study})
    req = urllib.request.Request(url)
    try:
        creds = load_credentials()
    except ValueError:  # a credentials file others can read: no link lookup (the jobs refuse it too)
        creds = None
    if creds:
        token = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return str(json.loads(r.read())["experiment"]["experiment_id"])
    except (OSError, ValueError, KeyError):
        return None


def _setting() -> str:
    """The tracking setting as the client reads it: `$LORARL_TRACKING`, else `$MLFLOW_TRACKING_URI`."""
    from lorarl.tracking.client import TRACKING_ENV

    return (os.environ.get(TRACKING_ENV) or os.environ.get("MLFLOW_TRACKING_URI") or "").strip()


def ui_target(results: str | Path, study: str) -> dict[str, Any]:
    """{'base': UI address, 'experiment_id', 'source': where the address came from, 'hint': how to open it}."""
    results = Path(results)
    setting = _setting()
    server = setting if setting.startswith(("http://", "https://")) else None
    source = "tracking setting" if server else ""
    info_file = results / ".tracking" / "server.json"
    if not setting and info_file.exists():
        try:
            server, source = json.loads(info_file.read_text())["uri"], f"{info_file}"
        except (OSError, ValueError, KeyError):
            server = None
    exp = server_experiment_id(server, study) if server else sqlite_experiment_id(results, study)
    configured = (os.environ.get(UI_ENV) or "").strip()
    if configured:
        return {"base": configured.rstrip("/"), "experiment_id": exp, "source": f"${UI_ENV}", "hint": ""}
    if server:
        return {"base": server.rstrip("/"), "experiment_id": exp, "source": source, "hint": ""}
    u = urllib.parse.urlsplit(SQLITE_UI)  # the sqlite store: a UI to start here, at the address of the links
    return {"base": SQLITE_UI, "experiment_id": exp, "source": "sqlite (results/mlflow.db)",
            "hint": f"start it with `mlflow ui --host {u.hostname} --port {u.port} --backend-store-uri "
                    f"sqlite:///{(results / 'mlflow.db').resolve()}` (another address: --mlflow-ui)"}


# MLflow's UI (3.17) picks its view from the address's `workflowType`, else from the browser's remembered sidebar
# switch (GenAI on a fresh browser: an experiment opens on the GenAI overview); not from the experiment's tags.
VIEW = "?workflowType=machine_learning"  # the model-training view: the experiment opens on its runs table


def run_url(target: dict[str, Any], run_id: str) -> str:
    if target.get("experiment_id"):
        return f"{target['base']}/#/experiments/{target['experiment_id']}/runs/{run_id}{VIEW}"
    return f"{target['base']}/#/runs/{run_id}{VIEW}"  # the UI's direct route: it finds the experiment


def experiment_url(target: dict[str, Any]) -> str | None:
    exp = target.get("experiment_id")
    return f"{target['base']}/#/experiments/{exp}/runs{VIEW}" if exp else None


def text_line(target: dict[str, Any], study: str) -> str:
    """`lorarl status`'s line: the study's runs table in the UI (how to start it, for sqlite), or why there is none."""
    exp = experiment_url(target)
    if not exp:
        return f"MLflow: no experiment {study!r} at {target['base']} yet (from {target['source']})"
    return f"MLflow: {exp}" + (f" ({target['hint']})" if target.get("hint") else "")
