"""Where the report's MLflow links point: the UI of the store that holds the study's runs.

The UI's address, first match wins:
1. `$LORARL_MLFLOW_UI` (e.g. an SSH port-forward, `http://localhost:5000`);
2. the `tracking:` setting (`lorarl aggregate/report --tracking`, which the aggregate rule passes from the
   profile; `$LORARL_TRACKING` in a job) when it is a server URI: a tracking server is its own UI;
3. with no setting at all, `<results>/.tracking/server.json` (written by `lorarl tracking serve`);
4. sqlite: `mlflow ui`'s default address, with the command that starts it over results/mlflow.db.
The experiment id comes from the store (sqlite read-only; a server: one GET with the credentials file's
basic auth, 5 s at most). Unknown, a run's link uses the UI's direct route `#/runs/<run id>`.
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
SQLITE_UI = "http://127.0.0.1:5000"  # `mlflow ui`'s default


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


def ui_target(results: str | Path, study: str) -> dict[str, Any]:
    """{'base': UI address, 'experiment_id', 'source': where the address came from, 'hint': how to open it}."""
    results = Path(results)
    setting = (os.environ.get("LORARL_TRACKING") or "").strip()
    server = setting if setting.startswith(("http://", "https://")) else None
    source = "tracking setting" if server else ""
    info_file = results / ".tracking" / "server.json"
    if not setting and info_file.exists():
        try:
            server, source = json.loads(info_file.read_text())["uri"], f"{info_file}"
        except (OSError, ValueError, KeyError):
            server = None
    exp = server_experiment_id(server, study) if server else sqlite_experiment_id(results, study)
    hint = "" if server else (f"start it with `mlflow ui --backend-store-uri sqlite:///{(results / 'mlflow.db').resolve()}`")
    base = server or SQLITE_UI
    if os.environ.get(UI_ENV):
        base, source = os.environ[UI_ENV], f"${UI_ENV}"
        hint = ""
    return {"base": base.rstrip("/"), "experiment_id": exp, "source": source or "sqlite (results/mlflow.db)",
            "hint": hint}


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
