"""The sqlite MLflow store is made whole or not at all; a half-made one is repaired or refused clearly.

Found by `python -m lorarl.pipeline.drills.faults --kills 8 --cells 2 --per-pass 2 --workers 2 --seed 1`: a
launcher SIGKILLed while its cell created results/mlflow.db left `_alembic_tmp_datasets` behind and
every later open failed `table _alembic_tmp_datasets already exists`. Here the kill lands exactly
inside a migration's table copy (a SQLAlchemy hook SIGKILLs the process on the k-th statement that
touches an `_alembic_tmp_` table).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lorarl.tracking import sqlite_store
from lorarl.tracking.client import Tracker
from lorarl.tracking.errors import TrackingError, TrackingUnavailable

REPO = Path(__file__).resolve().parents[2]

KILLER = textwrap.dedent("""
    import os, signal, sys
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    seen = [0]
    def kill_mid_migration(conn, cursor, statement, *a):
        if "_alembic_tmp_" in statement:
            seen[0] += 1
            if seen[0] == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)
    event.listen(Engine, "before_cursor_execute", kill_mid_migration)
    uri = "sqlite:///" + sys.argv[1]
    if sys.argv[3] == "lorarl":
        from lorarl.tracking import sqlite_store
        sqlite_store.ensure(uri)
    else:  # what lorarl did before: let MLflow build the store in place
        import mlflow
        mlflow.MlflowClient(uri).search_experiments(max_results=1)
    print("made")
""")


def _killed_while_creating(db: Path, kth: int, how: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LORARL_CACHE": str(db.parent / "cache")}  # no template: MLflow's
    return subprocess.run([sys.executable, "-c", KILLER, str(db), str(kth), how], capture_output=True, text=True,
                          timeout=300, env=env, cwd=db.parent)


def _whole(db: Path) -> bool:
    return sqlite_store.problem(sqlite_store.inspect(db), sqlite_store.head_revision()) is None


def test_a_new_store_is_whole_and_leaves_no_temporary_file(tmp_path: Path):
    db = tmp_path / "mlflow.db"
    sqlite_store.ensure(f"sqlite:///{db}")
    state = sqlite_store.inspect(db)
    assert state["revision"] == sqlite_store.head_revision() and state["tmp_tables"] == [] and state["runs"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    before = db.read_bytes()
    sqlite_store.ensure(f"sqlite:///{db}")  # a whole store is left alone
    assert db.read_bytes() == before
    sqlite_store.ensure("http://127.0.0.1:1")  # a server is not ours to make


@pytest.mark.slow
@pytest.mark.parametrize("kth", [1, 3])
def test_a_kill_inside_a_migration_never_leaves_a_half_made_store(tmp_path: Path, kth: int):
    # what MLflow alone does: the kill leaves a store every later open refuses
    bare = tmp_path / "bare" / "mlflow.db"
    bare.parent.mkdir()
    proc = _killed_while_creating(bare, kth, "mlflow")
    assert proc.returncode == -9 and "made" not in proc.stdout, proc.stderr[-2000:]
    state = sqlite_store.inspect(bare)
    assert sqlite_store.problem(state, sqlite_store.head_revision()) is not None, state
    # lorarl: the same kill leaves no store at all (only its temporary file), and the next open makes it
    ours = tmp_path / "ours" / "mlflow.db"
    ours.parent.mkdir()
    proc = _killed_while_creating(ours, kth, "lorarl")
    assert proc.returncode == -9 and "made" not in proc.stdout, proc.stderr[-2000:]
    assert not ours.exists() and list(ours.parent.glob(".mlflow.db.creating-*"))
    tracker = Tracker(ours.parent, "study")
    run = tracker.start("c0", "c0", {}, {"lr": 1})
    assert _whole(ours) and run and not list(ours.parent.glob(".mlflow.db.creating-*"))
    # and the store MLflow left half-made (no runs in it) is kept aside and made anew
    tracker = Tracker(bare.parent, "study")
    assert tracker.start("c0", "c0", {}, {"lr": 1}) and _whole(bare)
    assert len(list(bare.parent.glob("mlflow.db.interrupted-*"))) == 1


def _half_made(db: Path, runs: bool) -> None:
    tracker = Tracker(db.parent, "study")
    if runs:
        tracker.start("c0", "c0", {}, {"lr": 1})
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE _alembic_tmp_datasets (x INTEGER)")
    con.commit()
    con.close()


def test_a_half_made_store_without_runs_is_kept_aside_and_made_anew(tmp_path: Path, capfd):
    db = tmp_path / "mlflow.db"
    _half_made(db, runs=False)
    tracker = Tracker(tmp_path, "study")
    assert tracker.start("c0", "c0", {}, {"lr": 1})
    aside = list(tmp_path.glob("mlflow.db.interrupted-*"))
    assert len(aside) == 1 and sqlite_store.inspect(aside[0])["tmp_tables"] == ["_alembic_tmp_datasets"]
    assert "_alembic_tmp_datasets" in capfd.readouterr().err and _whole(db)


def test_a_half_made_store_with_runs_is_refused_untouched_with_the_way_out(tmp_path: Path, monkeypatch):
    db = tmp_path / "mlflow.db"
    _half_made(db, runs=True)
    before = db.read_bytes()
    runs = sqlite_store.inspect(db)["runs"]  # the cell's run and its study's parent run
    assert runs >= 1
    with pytest.raises(TrackingError, match=rf"half-migrated.*{runs} run\(s\).*lorarl sync-mlflow"):
        sqlite_store.ensure(f"sqlite:///{db}")
    monkeypatch.setenv("LORARL_TRACKING_RETRY_S", "5")
    with pytest.raises(TrackingUnavailable, match="refused.*_alembic_tmp_datasets"):
        Tracker(tmp_path, "study")
    assert db.read_bytes() == before and not list(tmp_path.glob("mlflow.db.interrupted-*"))


def test_a_store_whose_creation_stopped_between_migrations_is_made_anew(tmp_path: Path):
    db = tmp_path / "mlflow.db"
    sqlite_store.ensure(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    con.execute("UPDATE alembic_version SET version_num = '0a8213491aaa'")  # an early revision, no runs
    con.commit()
    con.close()
    assert "stopped at revision 0a8213491aaa" in sqlite_store.problem(sqlite_store.inspect(db),
                                                                      sqlite_store.head_revision())
    sqlite_store.ensure(f"sqlite:///{db}")
    assert _whole(db) and len(list(tmp_path.glob("mlflow.db.interrupted-*"))) == 1


def _rows(db: Path) -> dict:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        schema = con.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        rows = {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}
    finally:
        con.close()
    return {"schema": schema, "rows": rows}


def test_a_new_store_is_a_copy_of_the_versions_empty_store_equal_to_one_mlflow_makes(tmp_path: Path, monkeypatch):
    """The first store MLflow makes (its migrations) becomes the template; the next ones are copies of it,
    with the Default experiment's artifact location and times made here: equal to MLflow's own, table by table."""
    monkeypatch.setenv("LORARL_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db"
    sqlite_store.ensure(f"sqlite:///{first}")
    tpl = sqlite_store.template_path()
    assert tpl.parent == tmp_path / "cache" and sqlite_store.whole_template(tpl)
    monkeypatch.setattr(sqlite_store, "_made_by_mlflow", lambda tmp: pytest.fail("copied, not made again"))
    monkeypatch.chdir(tmp_path / "a")
    sqlite_store.ensure(f"sqlite:///{second}")
    a, b = _rows(first), _rows(second)
    assert a["schema"] == b["schema"] and set(a["rows"]) == set(b["rows"])
    assert {t: r for t, r in a["rows"].items() if t != "experiments"} == \
        {t: r for t, r in b["rows"].items() if t != "experiments"}
    con = sqlite3.connect(second)
    [(loc, created)] = con.execute("SELECT artifact_location, creation_time FROM experiments").fetchall()
    con.close()
    assert loc == str(tmp_path / "a" / "mlruns" / "0") and created > 0  # as MLflow sets it from this directory
    Tracker(tmp_path / "b", "s").start("c", run_name="c", tags={}, params={"x": 1})  # MLflow uses the copy


def test_a_bad_template_is_made_again_by_mlflow(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("LORARL_CACHE", str(tmp_path / "cache"))
    tpl = sqlite_store.template_path()
    tpl.parent.mkdir(parents=True)
    tpl.write_bytes(b"not a database")
    sqlite_store.ensure(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert _whole(tmp_path / "mlflow.db") and sqlite_store.whole_template(tpl)


def test_a_store_with_runs_opens_without_reading_mlflows_migrations(tmp_path: Path, monkeypatch):
    db = tmp_path / "mlflow.db"
    Tracker(tmp_path, "s").start("c", run_name="c", tags={}, params={})
    monkeypatch.setattr(sqlite_store, "head_revision", lambda: pytest.fail("walked the migration scripts"))
    sqlite_store.ensure(f"sqlite:///{db}")
