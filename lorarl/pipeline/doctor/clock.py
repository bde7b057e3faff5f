"""Clocks for `lorarl doctor`'s job costs: a process's age, CPU time beside wall time, fresh child processes, and
the machine's load from other users (what the same jobs cost on a busy shared machine).

:class:`LoadSampler` reads, about once a second, every runnable thread on the machine (/proc/*/task/*/stat) that is
not of this process or its descendants: the kernel shares the CPUs between sessions first when its autogroups are on
(a study's jobs all run in the session that started Snakemake, beside whatever else runs in it), else between
threads by their nice level. From those samples it computes the CPUs our process tree gets with k runnable threads
(``capacity``, :func:`share`): what the study's jobs will run at (lorarl.pipeline.doctor.jobs.makespan). The
doctor samples it during its job; a test samples it the same way during a study's run. Contention the kernel does
not show here (a virtual machine's CPUs shared with other machines, a disk shared with other users) is not seen.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Timer:
    """Wall and CPU seconds (this process, all its threads) of a block: ``with Timer() as t: ...; t.wall, t.cpu``."""

    def __enter__(self) -> "Timer":
        self.wall = self.cpu = 0.0
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall, self.cpu = time.perf_counter() - self._w, time.process_time() - self._c

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall, "cpu_s": self.cpu}


def child_cpu_s() -> float:
    """CPU seconds of this process's finished (waited-for) descendants so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_child(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """A fresh process, timed: wall and CPU seconds (its own and its descendants'), exit status, output tail."""
    c0, t0 = child_cpu_s(), time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except (OSError, subprocess.TimeoutExpired) as err:
        rc, tail = -1, f"{type(err).__name__}: {err}"
    return {"wall_s": time.perf_counter() - t0, "cpu_s": child_cpu_s() - c0, "rc": rc, "tail": tail}


LAUNCHER_PROBE = """
import sys, time
t0 = time.perf_counter()
import lorarl.cli, lorarl.pipeline.jobs.launch
from lorarl.language.study import cell_table, load_study
t1 = time.perf_counter()
cell_table(load_study(sys.argv[1]))
print(f"{t1 - t0} {time.perf_counter() - t1}")
"""


def launcher_probe(study_path: str) -> dict[str, Any]:
    """What `lorarl launch` costs before it submits, in a fresh process: the interpreter, the launcher's imports,
    and reading the study's cell table (every launcher and every job process reads it)."""
    out = run_child([sys.executable, "-c", LAUNCHER_PROBE, str(study_path)])
    try:
        imports_s, study_s = (float(x) for x in out["tail"].split()[-2:])
    except ValueError:
        imports_s, study_s = out["wall_s"], 0.0
    return {**out, "study_s": study_s, "imports_s": imports_s, "tail": out["tail"][-500:] if out["rc"] else ""}


def snakemake_dry_run(root: Path, study_path: str, results_dir: str, profile_dir: Path | None,
                      overrides: list[str] | None) -> dict[str, Any]:
    """`snakemake -n` of the study as the profile runs it, from the repo root (no lock taken): Snakemake's own start
    (reading the workflow, the study's cell table, the DAG), timed, and its log (the job-stats table)."""
    import json

    argv = [sys.executable, "-m", "snakemake", "-n", "--nolock", *(["--profile", str(profile_dir)] if profile_dir
                                                                   else []), "all", "--config",
            f"studies={json.dumps([str(Path(study_path).resolve())])}", f"results={Path(results_dir).resolve()}",
            *(overrides or [])]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    c0, t0 = child_cpu_s(), time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root, timeout=1800)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired) as err:
        rc, log = -1, f"{type(err).__name__}: {err}"
    return {"wall_s": time.perf_counter() - t0, "cpu_s": child_cpu_s() - c0, "rc": rc, "log": log}


def _stat(path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command name (state first), None when it is gone."""
    try:
        with open(path) as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """``root`` and every process below it (``parents``: process -> its parent)."""
    children: dict[int, list[int]] = {}
    for p, pp in parents.items():
        children.setdefault(pp, []).append(p)
    out, frontier = {root}, [root]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, []) if c not in out]
        out.update(frontier)
    return out


def _autogroup(pid: int | str) -> tuple[str, int] | None:
    """(group, nice) of a process's scheduling autogroup (its session), None when unknown."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def autogroups() -> bool:
    """Whether the kernel shares CPUs between sessions first (sched_autogroup): then a study, whose jobs all run in
    the session that started it, gets its session's share however many jobs it runs."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def competitors(root: int) -> tuple[list[tuple[float, int]], int] | None:
    """What the threads of process ``root`` and its descendants compete with now: (weight, runnable threads) of
    each other autogroup (session) with runnable threads, and the runnable threads of our own session outside
    ``root``'s tree ("mates"); with autogroups off, each other runnable thread on its own (weight by its nice
    level against ours, 1.25x per step, as the kernel weighs them). None off Linux."""
    if not os.path.isdir("/proc/self/task"):
        return None
    parents: dict[int, int] = {}
    running: list[tuple[int, int]] = []  # (process, nice) of each runnable thread
    for d in os.listdir("/proc"):
        f = _stat(f"/proc/{d}/stat") if d.isdigit() else None
        if not f:
            continue
        parents[int(d)] = int(f[1])
        try:
            tasks = os.listdir(f"/proc/{d}/task")
        except OSError:
            continue
        for t in tasks:
            ft = _stat(f"/proc/{d}/task/{t}/stat")
            if ft and ft[0] == "R":
                running.append((int(d), int(ft[16])))
    ours = descendants(root, parents)
    grouped, mine = autogroups(), _autogroup(root)
    my_nice = os.getpriority(os.PRIO_PROCESS, root)
    groups: dict[str, list[float]] = {}
    mates = 0
    for n, (pid, nice) in enumerate(running):
        if pid in ours:
            continue
        g = _autogroup(pid) if grouped else None
        if g is not None and mine is not None and g[0] == mine[0]:
            mates += 1
        elif g is not None:
            groups.setdefault(g[0], [1.25 ** -g[1], 0])[1] += 1
        else:
            groups[str(n)] = [1.25 ** (my_nice - nice), 1]
    return [(w, int(c)) for w, c in groups.values()], mates


def share(k: int, cores: int, others: list[tuple[float, int]], per_thread: bool, mates: int = 0) -> float:
    """CPUs our ``k`` runnable threads get beside ``others`` (weight, runnable threads) and ``mates`` (runnable
    threads of our session that are not ours): the kernel's fair share, each group capped by its runnable threads
    (one CPU each), the rest shared again (water-filling). Our session weighs 1 (autogroups; its share is split
    evenly between its runnable threads, ours and the mates) or ``k`` (threads compete one by one)."""
    if k <= 0:
        return 0.0
    size = k if per_thread else k + mates
    groups = [(float(k if per_thread else 1), size, True)] + [(w, n, False) for w, n in others if n > 0]
    left, got = float(cores), 0.0
    while groups:
        total = sum(w for w, _, _ in groups)
        capped = [g for g in groups if left * g[0] / total >= g[1]]
        if not capped:
            got += left * groups[0][0] / total if groups[0][2] else 0.0
            break
        for g in capped:
            left -= g[1]
            got += g[1] if g[2] else 0.0
        groups = [g for g in groups if g not in capped]
        if left <= 0:
            break
    return got * k / size


class LoadSampler:
    """What this process's tree competes with, sampled every ``every`` seconds in a thread (Linux; elsewhere no
    samples); :meth:`summary` turns the samples into the CPUs the tree gets with 1, 2, ... runnable threads."""

    def __init__(self, every: float = 1.0, root: int | None = None):
        self.every, self.root = every, root or os.getpid()
        self.samples: list[tuple[list[tuple[float, int]], int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            x = competitors(self.root)
            if x is not None:
                self.samples.append(x)
            self._stop.wait(self.every)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, most: int = 8) -> dict[str, Any]:
        """``capacity[k]``: mean CPUs our k runnable threads get; ``background``: mean runnable threads of others."""
        n, c, per_thread = len(self.samples), cores(), not autogroups()
        cap = {k: sum(share(k, c, o, per_thread, m) for o, m in self.samples) / n if n else float(min(k, c))
               for k in range(1, most + 1)}
        return {"cores": c, "samples": n, "autogroups": not per_thread, "capacity": cap,
                "background": sum(t for o, m in self.samples for _, t in o) / n if n else 0.0,
                "mates": sum(m for _, m in self.samples) / n if n else 0.0}
