"""MLflow: one experiment per study, one parent run per study with one *current* run per cell nested
under it (`mlflow.parentRunId`; base rows too), per-step metrics exactly once.

Files under results/ are the source of truth; MLflow is the browsable view. Rerunning a cell from
scratch marks its earlier run `lorarl.superseded=true` and soft-deletes it (restorable with
`mlflow runs restore`), so the default MLflow view shows exactly one run per cell. A resumed cell
(requeue, kill + rerun) reopens its own run and never logs a metric at or below that metric's
high-water mark, read back from the run (lorarl.train.checkpoint keeps MLflow behind the last checkpoint).

The store (`tracking:` in the profile, `$LORARL_TRACKING` in a job; lorarl.tracking.server serves one):
- `sqlite` (default): results/mlflow.db, every write under an flock on results/.mlflow.lock, waited
  for at most $LORARL_TRACKING_LOCK_S (default 60 s) per attempt;
- `http(s)://host:port`: an MLflow tracking server (PostgreSQL behind it); no lock, credentials for
  MLflow's basic-auth app from a file only the user can read (lorarl.tracking.credentials.load_credentials).
Every write is retried with exponential backoff on transient errors (connection refused, timeouts, 5xx,
a locked store) for at most $LORARL_TRACKING_RETRY_S (default 120 s), then raises TrackingUnavailable.
The trainer's per-step metrics (log_metrics(wait=False)) are the exception: while the store is
unreachable they stay pending in this process
(metrics.csv has them anyway), training goes on, and each later flush sends what is pending, the same
Metric objects with the same timestamps, so a batch the store committed before its reply was lost is
recognised by MLflow's primary key (key, timestamp, step, value) instead of being stored twice.
Creating a run, the final summary and the end of a run must succeed: after the retries the cell fails
with a message naming the store; its checkpoint stays, and its rerun resumes and catches MLflow up.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
import uuid
from contextlib import contextmanager, nullcontext
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from lorarl.gitrepo import REPO, code_state
from lorarl.tracking import sqlite_store
from lorarl.tracking.errors import TrackingError, TrackingUnavailable

CELL_TAG = "lorarl.cell_id"
SUPERSEDED_TAG = "lorarl.superseded"
START_TAG = "lorarl.start_token"  # makes a retried create_run idempotent (a lost reply never makes 2 runs)
STUDY_RUN_TAG = "lorarl.study_run"  # "true" on the study's parent run: every cell and base run nests under it
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nesting tag (the UI shows the cells under the study run)
# the experiment's kind (the UI's kind selector shows it); MLflow 3.17's UI picks the view it opens from the link
# or the browser's switch, not from this tag (lorarl.report.mlflow_links.VIEW; docs/tracking.md)
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
STATE_TAG, REASON_TAG, KILLS_TAG = "lorarl.state", "lorarl.killed_reason", "lorarl.killed_attempts"  # dead_runs
PAUSED_AT_TAG = "lorarl.paused_at_step"  # a paused run's step (lorarl.train.cellrun); gone once the run goes on
PACKAGES = ("torch", "transformers", "trl", "peft", "lorarl")
TRACKING_ENV = "LORARL_TRACKING"  # sqlite | http(s)://host:port (lorarl launch sets it from the profile)
RETRY_ENV = "LORARL_TRACKING_RETRY_S"  # total retry time of a write that must succeed
LOCK_ENV = "LORARL_TRACKING_LOCK_S"  # sqlite: longest wait for results/.mlflow.lock per attempt
# MLflow error codes that no retry can fix (everything else: connection errors, 5xx, locks, is retried)
PERMANENT = {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "UNAUTHENTICATED",
             "PERMISSION_DENIED", "BAD_REQUEST", "ENDPOINT_NOT_FOUND", "INVALID_STATE"}
T = TypeVar("T")


def resolve_tracking(value: str | None, results_dir: str | Path) -> str:
    """The MLflow tracking URI of a `tracking` setting ('sqlite' or an http(s):// server URI)."""
    value = (value or os.environ.get(TRACKING_ENV) or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite").strip()
    if value == "sqlite":
        return f"sqlite:///{Path(results_dir).resolve()}/mlflow.db"
    if value.startswith(("http://", "https://", "sqlite:///")) and len(value.split("://", 1)[1]) > 0:
        return value.rstrip("/")
    raise TrackingError(f"tracking: {value!r} is not allowed; allowed: 'sqlite' (results/mlflow.db) or the "
                        f"http(s)://host:port URI of an MLflow tracking server (`lorarl tracking serve` prints it)")


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise TrackingError(f"${name}: {os.environ[name]!r} is not a number of seconds") from None


class LockTimeout(TimeoutError):
    pass


@contextmanager
def _locked(results_dir: str | Path, timeout_s: float | None = None) -> Iterator[None]:
    """Serialise sqlite writes across processes (sqlite + concurrent writers = 'database is locked').
    Waits at most `timeout_s` for the lock, then raises LockTimeout naming the holder."""
    timeout_s = _env_float(LOCK_ENV, 60.0) if timeout_s is None else timeout_s
    Path(results_dir).mkdir(parents=True, exist_ok=True)
    path = Path(results_dir) / ".mlflow.lock"
    with open(path, "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip() or "unknown"
                    raise LockTimeout(f"{path} held for more than {timeout_s:g} s (last holder: {holder})") from None
                time.sleep(0.05)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} host {os.uname().nodename}\n")
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


locked = _locked  # public: other stages that open the sqlite store take the same lock


def transient(err: BaseException) -> bool:
    """Worth retrying: a lock timeout, a connection error, a timeout, a 5xx; not a refused request."""
    if isinstance(err, (LockTimeout, ConnectionError, TimeoutError, OSError)):
        return True
    code = getattr(err, "error_code", None)
    if code in PERMANENT:
        return False
    return type(err).__name__ in {"MlflowException", "RestException", "OperationalError"} or "locked" in str(err)


def git_state(repo: str | Path | None = None) -> dict[str, str]:
    """MLflow tags (and the report's provenance) of the code that runs: HEAD sha and whether it is dirty, as
    the job's provenance says (lorarl.gitrepo.code_state: a tracked change or an untracked file)."""
    state = code_state(repo or REPO)
    if state["sha"] is None:
        return {"git.sha": "unknown", "git.dirty": "unknown"}
    return {"git.sha": state["sha"], "git.dirty": str(state["dirty"]).lower()}


def package_versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[f"version.{p}"] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[f"version.{p}"] = "absent"
    return out


class Tracker:
    """A cell's MLflow run. Writes are retried with backoff (sqlite: under the results-dir lock);
    metric logging is batched and survives an unreachable store (pending until the next flush)."""

    def __init__(self, results_dir: str | Path, study: str, tracking: str | None = None):
        import mlflow

        self.results_dir = Path(results_dir)
        self.study = study
        self.uri = resolve_tracking(tracking, results_dir)
        self.server = is_server(self.uri)
        if self.server:
            from lorarl.tracking.credentials import configure_client

            configure_client(self.uri)  # credentials from the user's 0600 file; our backoff, not MLflow's
        self.retry_s = _env_float(RETRY_ENV, 120.0)
        self.run_id: str | None = None
        self.high_water = -1  # last step already logged in this run
        self.logged: dict[str, int] = {}  # metric -> last step logged (a kill mid-batch leaves keys behind)
        self.pending: list[Any] = []  # Metric objects not yet acknowledged by the store (same ts on resend)
        self.behind_since: float | None = None  # the store failed a metric flush; training goes on
        # sqlite: the first client creates the store, under the lock, whole or not at all (sqlite_store)
        self.client = self.retry("open the store", lambda: (sqlite_store.ensure(self.uri),
                                                             mlflow.MlflowClient(self.uri))[1])
        self.experiment_id = self.retry("open the experiment", self._experiment)
        self.parent_id: str | None = None  # the study's parent run (study_run), found or made once

    # ---- plumbing -----------------------------------------------------------------------------------
    def _lock(self, timeout_s: float | None = None) -> Any:
        return nullcontext() if self.server else _locked(self.results_dir, timeout_s)

    def retry(self, what: str, fn: Callable[[], T], budget_s: float | None = None) -> T:
        budget_s = self.retry_s if budget_s is None else budget_s
        t0, delay, attempt = time.monotonic(), 0.5, 0
        while True:
            attempt += 1
            try:
                with self._lock(max(0.0, min(_env_float(LOCK_ENV, 60.0), t0 + budget_s - time.monotonic()))):
                    return fn()
            except Exception as err:  # noqa: BLE001 - classified below
                spent = time.monotonic() - t0
                if not transient(err) or spent + delay > budget_s:
                    kind = "refused" if not transient(err) else f"failed {attempt} time(s) over {spent:.0f} s"
                    raise TrackingUnavailable(
                        f"MLflow store {self.uri}: {what} {kind}: {type(err).__name__}: {str(err)[:500]} "
                        f"(the cell's files under {self.results_dir} are the record; `lorarl sync-mlflow` "
                        f"replays them into the store)") from err
                time.sleep(delay)
                delay = min(2 * delay, 10.0)

    def _experiment(self) -> str:
        exp = self.client.get_experiment_by_name(self.study)
        if exp is not None:
            if KIND_TAG not in exp.tags:  # made by an older lorarl: tagged now (a kind set by hand stays)
                self.client.set_experiment_tag(exp.experiment_id, KIND_TAG, KIND)
            return exp.experiment_id
        where = None if self.server else (self.results_dir.resolve() / "mlartifacts").as_uri()  # not the cwd's mlruns
        try:
            return self.client.create_experiment(self.study, artifact_location=where, tags={KIND_TAG: KIND})
        except Exception as err:  # noqa: BLE001 - another cell created it between our two calls
            if getattr(err, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.client.get_experiment_by_name(self.study).experiment_id

    # ---- runs ---------------------------------------------------------------------------------------
    def _study_runs(self) -> list[Any]:
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{STUDY_RUN_TAG}` = 'true'")
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))  # the oldest is the study's

    def study_run(self, start_time: int | None = None) -> str:
        """The study's parent run, made by the first job that needs it, starting now (or at `start_time`,
        ms: a run rebuilt from the files starts where the study did). sqlite: find-or-create runs under
        the results-dir lock, so one process makes it. A server has no lock: two jobs racing may both
        make one; each then keeps the oldest (the same for both) and deletes its own extra run. A requeued
        or resumed cell finds the same run; a retried create after a lost reply is found by its token."""
        if self.parent_id is not None:
            return self.parent_id
        token = uuid.uuid4().hex

        def find_or_create() -> str:
            runs = self._study_runs()
            if not runs:
                tags = {"lorarl.study": self.study, STUDY_RUN_TAG: "true", START_TAG: token, **git_state()}
                made = self.client.create_run(self.experiment_id, start_time=start_time, run_name=self.study,
                                              tags=tags).info.run_id
                self.client.set_terminated(made, status="FINISHED")  # a view, not a job: never "running"
                runs = self._study_runs()
            for extra in runs[1:]:
                if extra.data.tags.get(START_TAG) == token:
                    self.client.delete_run(extra.info.run_id)
            return runs[0].info.run_id

        self.parent_id = self.retry("find or make the study run", find_or_create)
        return self.parent_id

    def start(self, cell_id: str, run_name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
        """Fresh run for a cell; earlier active runs of the same cell become superseded."""
        token = uuid.uuid4().hex
        all_tags = {CELL_TAG: cell_id, "lorarl.study": self.study, **git_state(), **package_versions(), **tags,
                    START_TAG: token, PARENT_TAG: self.study_run()}

        def create() -> str:
            old = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{CELL_TAG}` = '{cell_id}'")
            mine = [r for r in old if r.data.tags.get(START_TAG) == token]  # a retry after a lost reply
            for r in old:
                if r.data.tags.get(START_TAG) != token:
                    self.client.set_tag(r.info.run_id, SUPERSEDED_TAG, "true")
                    if r.info.status == "RUNNING":  # its process died (this one holds the cell): not running on
                        self.client.set_tag(r.info.run_id, STATE_TAG, "killed")
                        self.client.set_tag(r.info.run_id, REASON_TAG, "superseded by a fresh start of the cell")
                        self.client.set_terminated(r.info.run_id, status="KILLED")
                    self.client.delete_run(r.info.run_id)
            if mine:
                return mine[0].info.run_id
            return self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags).info.run_id

        self.run_id = self.retry(f"create the run of cell {cell_id}", create)
        # a Tracker reused for the next cell (the toy study's batch): nothing of the last run carries over
        self.logged, self.high_water, self.pending, self.behind_since = {}, -1, [], None
        self.retry(f"log the params of cell {cell_id}", lambda: self._log_params(params))
        return self.run_id

    def resume(self, run_id: str) -> str:
        """Reopen a run after a requeue or a kill: the high-water mark is read from the run itself
        (per metric), so a (metric, step) already logged by any earlier attempt is never logged again.
        A run still RUNNING (or ended KILLED by lorarl.tracking.dead_runs) lost its last attempt to a kill:
        ``lorarl.killed_attempts`` counts them; ``lorarl.state`` says running until the run ends. A paused run's
        ``lorarl.paused_at_step`` goes: the run trains on (a finished run never keeps it; a new pause sets it again)."""
        from mlflow.entities import RunTag

        self.run_id = run_id

        def reopen() -> dict[str, int]:
            run = self.client.get_run(run_id)
            if run.info.lifecycle_stage != "active":
                raise RuntimeError(f"MLflow run {run_id} is {run.info.lifecycle_stage}; cannot resume it")
            tags = {STATE_TAG: "running"}
            if run.info.status == "RUNNING" or run.data.tags.get(STATE_TAG) == "killed":  # its last attempt died
                tags[KILLS_TAG] = str(int(run.data.tags.get(KILLS_TAG, "0")) + 1)  # (the caller holds the cell's lock)
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            if PAUSED_AT_TAG in run.data.tags:
                self.client.delete_tag(run_id, PAUSED_AT_TAG)
            self.client.update_run(run_id, status="RUNNING")
            return {key: max((m.step for m in self.client.get_metric_history(run_id, key)), default=-1)
                    for key in run.data.metrics}

        self.logged = self.retry(f"reopen run {run_id}", reopen)
        self.high_water = max(self.logged.values(), default=-1)
        return run_id

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        self.retry("set tags", lambda: self.client.log_batch(self.run_id, tags=items))

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    # ---- metrics ------------------------------------------------------------------------------------
    def log_metrics(self, rows: list[dict[str, float]], wait: bool = True) -> bool:
        """rows: [{"step": s, name: value, ...}]; a metric's steps <= its high-water mark are dropped.
        wait=True (evaluation, sync): retried for the full budget, then TrackingUnavailable. wait=False
        (the trainer's per-step flushes): returns False when the store is unreachable; the rows stay
        pending (training goes on) and the next call sends them; once behind, a flush tries once."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        queued = {(m.key, m.step) for m in self.pending}
        for row in rows:
            step = int(row["step"])
            for k, v in row.items():
                if k == "step" or step <= self.logged.get(k, -1) or (k, step) in queued:
                    continue
                self.pending.append(Metric(k, float(v), ts, step))
                queued.add((k, step))
        if wait:
            self.catch_up()
            return True
        try:
            self._flush(0.0 if self.behind_since is not None else min(self.retry_s, 10.0))
        except TrackingUnavailable as err:
            if self.behind_since is None:
                self.behind_since = time.time()
                print(f"[lorarl] {err}\n[lorarl] training goes on; {len(self.pending)} metric values wait for "
                      f"the store (metrics.csv has them)", file=sys.stderr, flush=True)
            return False
        if self.behind_since is not None:
            print(f"[lorarl] MLflow store {self.uri} is back after {time.time() - self.behind_since:.0f} s; "
                  f"caught up", file=sys.stderr, flush=True)
            self.behind_since = None
        return True

    def _flush(self, budget_s: float | None = None) -> None:
        while self.pending:
            chunk = self.pending[:500]
            self.retry("log metrics", lambda: self.client.log_batch(self.run_id, metrics=chunk), budget_s)
            for m in chunk:
                self.logged[m.key] = max(self.logged.get(m.key, -1), m.step)
                self.high_water = max(self.high_water, m.step)
            del self.pending[: len(chunk)]

    def catch_up(self) -> None:
        """Send every pending metric value, retrying for the full budget (raises TrackingUnavailable)."""
        self._flush(self.retry_s)
        if self.behind_since is not None:
            print(f"[lorarl] MLflow store {self.uri} is back after {time.time() - self.behind_since:.0f} s; "
                  f"caught up", file=sys.stderr, flush=True)
        self.behind_since = None

    def log_summary(self, values: dict[str, float], tags: dict[str, str] | None = None) -> None:
        """Scalar results (no step series) and extra tags, e.g. evaluation numbers."""
        from mlflow.entities import Metric, RunTag

        self.catch_up()
        ts = int(time.time() * 1000)
        values = {k: v for k, v in values.items() if self.logged.get(k, -1) < 0}  # resumed: logged already
        metrics = [Metric(k, float(v), ts, 0) for k, v in values.items()]
        items = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        self.retry("log the summary", lambda: self.client.log_batch(self.run_id, metrics=metrics, tags=items))
        self.logged.update({k: 0 for k in values})

    def finish(self, status: str = "FINISHED", state: str | None = None) -> None:
        """End the run. FINISHED must reach the store (after catching up); a failure status is best
        effort (a quick try: the original error matters more than an unreachable store), with ``state``
        as the run's ``lorarl.state`` tag (preempted, failed)."""
        if status == "FINISHED":
            self.catch_up()
            self.retry("end the run", lambda: self.client.set_terminated(self.run_id, status=status))
            return

        def end() -> None:
            if state is not None:
                self.client.set_tag(self.run_id, STATE_TAG, state)
            self.client.set_terminated(self.run_id, status=status)

        try:
            self.retry("end the run", end, 2.0)
        except TrackingUnavailable as err:
            print(f"[lorarl] {err}", file=sys.stderr, flush=True)
