"""The grading workers: persistent processes that run ``fn(*args)`` under a wall-clock limit each, killed and
replaced on expiry (:mod:`lorarl.grading.verify` runs math-verify in them). Workers start by the ``spawn`` method
with ``PYTHONHASHSEED`` fixed (string hashing orders sympy's sets), import math-verify, then announce themselves.
The pool size defaults to ``min(8, cpu_count)`` and can be set with ``LORARL_GRADER_WORKERS``."""

from __future__ import annotations

import atexit
import collections
import multiprocessing as mp
import os
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

_GRACE_S = 0.5          # parent-side margin on top of the in-worker timer
_STARTUP_S = 120.0      # how long to wait for a fresh worker to import math-verify


def _worker_main(conn: Connection) -> None:
    """Worker loop: announce readiness, then run ``(fn, args)`` requests until the pipe closes."""
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when workers stop
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401 - pay the import before announcing readiness

    conn.send(("ready", os.environ.get("PYTHONHASHSEED")))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - report, keep serving
            conn.send(("error", repr(exc)))


WORKER_HASH_SEED = "0"   # string hashing in the workers (set iteration order inside sympy)
_env_lock = threading.Lock()


class _Worker:
    """One persistent worker process and its pipe."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True,
                                name="lorarl-grader")
        with _env_lock:   # a spawned interpreter reads its hash seed from the environment
            old = os.environ.get("PYTHONHASHSEED")
            os.environ["PYTHONHASHSEED"] = WORKER_HASH_SEED
            try:
                self.proc.start()
            finally:
                if old is None:
                    os.environ.pop("PYTHONHASHSEED", None)
                else:
                    os.environ["PYTHONHASHSEED"] = old
        child.close()
        self.ready = False
        self.hash_seed: str | None = None   # PYTHONHASHSEED the worker reported at start
        self.started = time.monotonic()

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(timeout=5)
        finally:
            self.conn.close()


class _Pool:
    """Persistent worker processes with a per-task wall-clock limit, killed and replaced on expiry."""

    def __init__(self, n_workers: int) -> None:
        self._ctx = mp.get_context("spawn")
        self._n = max(1, n_workers)
        self._workers: list[_Worker] = [_Worker(self._ctx) for _ in range(self._n)]
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def _replace(self, k: int) -> None:
        self._workers[k].kill()
        self._workers[k] = _Worker(self._ctx)

    def run(self, fn: Callable[..., Any], arglist: Sequence[tuple], timeout_s: float
            ) -> list[tuple[str, Any]]:
        """Run ``fn(*args)`` for every args in parallel; each result is ``(status, value)`` with
        status ``ok``, ``error`` (exception or dead worker) or ``timeout`` (worker killed)."""
        with self._lock:
            results: list[tuple[str, Any]] = [("error", "not run")] * len(arglist)
            pending = collections.deque(range(len(arglist)))
            running: dict[int, tuple[int, float]] = {}   # worker -> (task, deadline)
            try:
                while pending or running:
                    for k, w in enumerate(self._workers):
                        if pending and w.ready and k not in running:
                            i = pending.popleft()
                            try:
                                w.conn.send((fn, arglist[i]))
                                running[k] = (i, time.monotonic() + timeout_s + _GRACE_S)
                            except (OSError, ValueError):
                                pending.appendleft(i)
                                self._replace(k)
                    now = time.monotonic()
                    deadlines = [d for _, d in running.values()]
                    deadlines += [w.started + _STARTUP_S for w in self._workers if not w.ready]
                    wait_s = max(0.0, min(deadlines) - now) if deadlines else 0.0
                    self._hear(wait([w.conn for w in self._workers], timeout=wait_s), running, results)
                    now = time.monotonic()
                    for k, (i, deadline) in list(running.items()):
                        if now >= deadline:
                            results[i] = ("timeout", None)
                            del running[k]
                            self._replace(k)
                    for k, w in enumerate(self._workers):
                        if not w.ready and now >= w.started + _STARTUP_S:
                            raise RuntimeError("grading worker failed to start")
            except BaseException:
                # interrupted (e.g. KeyboardInterrupt): busy workers would answer late, into the
                # next call; replace them so no stale result can ever be read
                for k in running:
                    self._replace(k)
                raise
            return results

    def wait_ready(self, timeout_s: float = _STARTUP_S) -> bool:
        """Wait until every worker has announced itself (imported math-verify, reported its hash seed): a batch
        can end before a slow starter is ready, as ready workers take all its tasks. False on the deadline."""
        with self._lock:
            deadline = time.monotonic() + timeout_s
            while not all(w.ready for w in self._workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._hear(wait([w.conn for w in self._workers if not w.ready], timeout=left), {}, [])
            return True

    def _hear(self, conns: list, running: dict[int, tuple[int, float]], results: list[tuple[str, Any]]) -> None:
        """Read what the workers behind ``conns`` sent: a worker's hello (ready, its hash seed), a running task's
        result (into ``results``), or its end (its task an error; a fresh worker in its place)."""
        for conn in conns:
            k = next(j for j, w in enumerate(self._workers) if w.conn is conn)
            try:
                status, value = conn.recv()
            except (EOFError, OSError):       # the worker died (crash, OOM, ...)
                if k in running:
                    results[running.pop(k)[0]] = ("error", "worker died")
                self._replace(k)
                continue
            if status == "ready":
                self._workers[k].ready, self._workers[k].hash_seed = True, value
            elif k in running:
                results[running.pop(k)[0]] = (status, value)

    def close(self) -> None:
        for w in self._workers:
            w.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def get_pool() -> _Pool:
    """This process's pool, started on first use (a fork's child starts its own)."""
    global _pool
    with _pool_lock:
        if _pool is not None and _pool.pid != os.getpid():
            _pool = None          # inherited through fork: those workers belong to the parent
        if _pool is None:
            n = int(os.environ.get("LORARL_GRADER_WORKERS", min(8, os.cpu_count() or 1)))
            _pool = _Pool(n)
        return _pool


def start_pool() -> None:
    """Start this process's workers now and return at once: a job calls it before loading its model, so the workers
    import math-verify beside the load instead of inside the first step."""
    get_pool()


def wait_started(timeout_s: float = _STARTUP_S) -> float:
    """Wait until a started pool's every worker is ready; the seconds waited (0.0 when no pool was started), recorded
    as the job's start-up "grading pool" (lorarl.jobclock). A job calls it before its first step, so no step pays it."""
    from lorarl import jobclock

    with _pool_lock:
        pool = _pool if _pool is not None and _pool.pid == os.getpid() else None
    if pool is None or all(w.ready for w in pool._workers):
        return 0.0
    t0 = time.perf_counter()
    pool.wait_ready(timeout_s)
    waited = time.perf_counter() - t0
    jobclock.startup("grading pool", waited)
    return waited


def shutdown_pool() -> None:
    """Stop the grading workers (they are restarted on the next call)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


atexit.register(shutdown_pool)
