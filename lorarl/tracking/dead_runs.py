"""A cell's MLflow run whose process is gone is ended KILLED, never left RUNNING.

A training process killed outright (SIGKILL, out of memory, a node failure, a job past its time limit) cannot
end its own run. Its cell's lock (``{results}/{study}/.checkpoints/{cell}/.lock``, an ``flock`` every trainer of
the cell holds for as long as it trains: lorarl.train.checkpoint) says whether anyone still trains the cell: a
run that is RUNNING while that lock is free belongs to a dead process. :func:`end_dead_runs` ends such runs
``KILLED`` with the tags ``lorarl.state=killed`` and ``lorarl.killed_reason`` (who noticed). It is called by the
launcher when a train or pack job ends without its outputs, and by ``lorarl sync-mlflow``; the next attempt of
the cell needs no call: it holds the lock, reopens the run (``Tracker.resume``), counts the attempt that died in
``lorarl.killed_attempts`` and sets the run RUNNING again. A run with no lock file (a toy study's batch, a base
row) is left alone: nothing says whether its process lives.

The lock is probed while the run is ended (taken without waiting, released at once), so a trainer that starts on
the cell meanwhile waits for it instead of finding a run ended under it.
"""

from __future__ import annotations

import fcntl
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from lorarl import paths
from lorarl.tracking.client import CELL_TAG, REASON_TAG, STATE_TAG


def lock_path(results_dir: str | Path, study: str, cell_id: str) -> Path:
    return Path(paths.pattern("checkpoints", results=str(results_dir), study=study, cell=cell_id)) / ".lock"


@contextmanager
def held_if_free(lock: Path) -> Iterator[bool]:
    """True (and the lock held until the block ends) when no process holds the cell's lock; False when one
    does or when the cell has no lock file at all (nothing to judge by)."""
    try:
        fh = open(lock, "r")
    except FileNotFoundError:
        yield False
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def end_dead_runs(tracker: Any, why: str, cells: Iterable[str] | None = None) -> list[str]:
    """End KILLED every RUNNING cell run of the tracker's study (or of ``cells``) whose cell lock is free; the run
    ids ended. ``why``: the ``lorarl.killed_reason`` tag (who noticed, e.g. the launcher and its job's state)."""
    wanted = None if cells is None else set(cells)
    runs = tracker.retry("find the running cell runs", lambda: tracker.client.search_runs(
        [tracker.experiment_id], filter_string="attributes.status = 'RUNNING'"))
    ended = []
    for run in runs:
        cell = run.data.tags.get(CELL_TAG)
        if cell is None or (wanted is not None and cell not in wanted):
            continue
        with held_if_free(lock_path(tracker.results_dir, tracker.study, cell)) as dead:
            if dead and _end(tracker, run.info.run_id, why):
                ended.append(run.info.run_id)
                print(f"[lorarl] MLflow run {run.info.run_id} of cell {cell}: its process is gone ({why}); ended "
                      f"KILLED", file=sys.stderr, flush=True)
    return ended


def _end(tracker: Any, run_id: str, why: str) -> bool:
    from mlflow.entities import RunTag

    def end() -> bool:
        if tracker.client.get_run(run_id).info.status != "RUNNING":  # ended meanwhile by its own process
            return False
        tracker.client.log_batch(run_id, tags=[RunTag(STATE_TAG, "killed"), RunTag(REASON_TAG, why[:5000])])
        tracker.client.set_terminated(run_id, status="KILLED")
        return True

    return tracker.retry(f"end the dead run {run_id}", end)


def after_job(results_dir: str | Path, study: str, cells: Iterable[str], why: str) -> list[str]:
    """The launcher's call when a train or pack job ended without its outputs: end its cells' dead runs. Never
    fails the launcher (a store away: said, and ``lorarl sync-mlflow`` or the next attempt ends them later)."""
    from lorarl.tracking.client import Tracker, resolve_tracking

    try:
        local = resolve_tracking(None, results_dir).startswith("sqlite:///")
        if local and not (Path(results_dir) / "mlflow.db").exists():
            return []  # no store yet: no run to end
        tracker = Tracker(results_dir, study)
        tracker.retry_s = min(tracker.retry_s, 10.0)
        return end_dead_runs(tracker, why, cells)
    except Exception as err:  # noqa: BLE001 - the job's own failure is what the launcher reports
        print(f"[lorarl] could not end the dead MLflow runs of {', '.join(cells)}: {type(err).__name__}: {err}",
              file=sys.stderr, flush=True)
        return []
