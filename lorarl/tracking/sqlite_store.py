"""Creating the sqlite MLflow store so that no kill can leave a half-made one (issue 16).

MLflow builds a new sqlite store in place: it creates the initial tables, then runs some fifty alembic
migrations, several of which copy a table through `_alembic_tmp_<name>` (sqlite has no ALTER COLUMN).
A SIGKILL in that second (measured by `python -m lorarl.pipeline.drills.faults`: a launcher killed while its
first cell opened `results/mlflow.db`) leaves a store that every later open refuses with
`table _alembic_tmp_datasets already exists`, and the study can never finish.

So a new store is made in a temporary file beside it and renamed into place once complete (rename is
atomic): `results/mlflow.db` is either absent or whole. A store already left half-made (by an older
lorarl, or an interrupted `mlflow db upgrade`) is recognised: with no runs in it nothing can be lost,
so it is moved aside (kept, named in the message) and made again; with runs in it, the cell fails
with a message saying how to rebuild the view from the cell files (`lorarl sync-mlflow`).
Callers hold the results-dir lock (lorarl.tracking.client._locked), so one process creates it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import time
import uuid
from pathlib import Path

from lorarl.tracking.errors import TrackingError

TMP_PREFIX = "_alembic_tmp_"  # alembic's batch-migration copies (sqlite), present only mid-migration


def db_path(uri: str) -> Path | None:
    """The file of a `sqlite:///` URI (None for any other store)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def inspect(db: Path) -> dict:
    """What the file holds: its tables' state, schema revision and number of runs (read-only)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rev = con.execute("SELECT version_num FROM alembic_version").fetchone() if "alembic_version" in tables else None
        runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    finally:
        con.close()
    return {"tmp_tables": sorted(t for t in tables if t.startswith(TMP_PREFIX)), "revision": rev[0] if rev else None,
            "runs": runs, "tables": len(tables)}


def problem(state: dict, head: str) -> str | None:
    """Why a store is half-made, or None if it is whole (or from a newer MLflow: MLflow says so itself)."""
    if state["tmp_tables"]:
        return f"an interrupted schema migration left table(s) {', '.join(state['tmp_tables'])}"
    if state["revision"] is None:
        return "it has no schema revision (its creation was interrupted)"
    if state["revision"] != head and state["runs"] == 0:
        return f"its schema stopped at revision {state['revision']} (head {head}): its creation was interrupted"
    return None


def _forget(uri: str) -> None:
    """Drop MLflow's cached engine of `uri` (SqlAlchemyStore keeps one per URI for the process), so
    that a file moved aside is not written through connections opened before the move."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()


def template_path() -> Path:
    """An empty store made by this MLflow version (``$LORARL_CACHE``, else ``~/.cache/lorarl``): a new store is
    a copy of it. MLflow builds a new sqlite store with some fifty alembic migrations, about 10 s of CPU per
    results folder, and every test, study and doctor smoke run starts one."""
    from importlib.metadata import version

    root = Path(os.environ.get("LORARL_CACHE") or Path.home() / ".cache" / "lorarl")
    return root / f"mlflow-{version('mlflow-skinny')}-empty.db"


def _made_by_mlflow(tmp: Path) -> None:
    import mlflow

    mlflow.MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)  # the store exists and answers
    _forget(f"sqlite:///{tmp}")  # close its connections before the file moves


def _localise(db: Path) -> None:
    """A copied template as MLflow would have made it here: its Default experiment's artifact location (this
    working directory's ``mlruns/0``) and times (now)."""
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    now = int(time.time() * 1000)
    con = sqlite3.connect(db, timeout=30)
    try:
        con.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                    "WHERE experiment_id = 0", (append_to_uri_path(resolve_uri_if_local("./mlruns"), "0"), now, now))
        con.commit()
    finally:
        con.close()


def _save_template(made: Path, tpl: Path) -> None:
    """Keep a copy of a store MLflow just made as the template (atomic; a failure only costs the next store)."""
    try:
        tpl.parent.mkdir(parents=True, exist_ok=True)
        part = tpl.with_name(f".{tpl.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
        shutil.copyfile(made, part)
        os.replace(part, tpl)
    except OSError:
        pass


def _create(db: Path) -> None:
    """Make a complete store at `db`: built in a temporary file beside it (a copy of this MLflow version's empty
    store, made by MLflow the first time), then renamed into place."""
    tmp = db.parent / f".{db.name}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # new name: MLflow caches by URI
    tpl = template_path()
    if tpl.exists() and whole_template(tpl):
        shutil.copyfile(tpl, tmp)
        _localise(tmp)
    else:
        _made_by_mlflow(tmp)
        _save_template(tmp, tpl)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, db)
    dfd = os.open(db.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def whole_template(tpl: Path) -> bool:
    """The template is an empty store at MLflow's head revision (else it is made again by MLflow)."""
    try:
        state = inspect(tpl)
    except sqlite3.Error:
        return False
    return state["runs"] == 0 and not state["tmp_tables"] and state["revision"] == head_revision()


def ensure(uri: str) -> None:
    """A whole store at `uri` (sqlite only; a server URI is left alone). Call under the results lock."""
    db = db_path(uri)
    if db is None:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    for stale in db.parent.glob(f".{db.name}.creating-*"):  # a creator killed before its rename
        stale.unlink(missing_ok=True)
    if not db.exists() or db.stat().st_size == 0:
        _create(db)
        return
    state = inspect(db)
    if state["runs"] and not state["tmp_tables"] and state["revision"] is not None:
        return  # a store with runs: whole (a schema older or newer than this MLflow's is MLflow's to say)
    why = problem(state, head_revision())
    if why is None:
        return
    if state["runs"]:
        raise TrackingError(
            f"MLflow store {db} is half-migrated: {why}; it holds {state['runs']} run(s), so lorarl will not "
            f"replace it. The cell files are the record: move it aside (mv {db} {db}.broken) and run "
            f"`lorarl sync-mlflow <study>` for each study in {db.parent} to rebuild the view, or restore a backup.")
    aside = db.with_name(f"{db.name}.interrupted-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    _forget(uri)
    os.replace(db, aside)
    print(f"lorarl: MLflow store {db} was half-made ({why}; no runs in it): kept as {aside.name}, made anew",
          file=sys.stderr, flush=True)
    _create(db)
