"""What plain `snakemake all` prints beside Snakemake's own lines: the study's progress while jobs run, and where
its outputs are at the end.

profiles/default shows one line per finished job, minutes apart while cells train, and nothing at all while the
local base model builds (its job is the first one, alone, for minutes). `Progress`, a thread the Snakefile's
`onstart` starts and its `onsuccess`/`onerror` stop, prints every `progress_every` seconds (workflow config) one
line per study, from what `lorarl status --watch` computes (lorarl.pipeline.progress.watch.snapshot: the cells' states,
the steps trained, the ETA of lorarl.pipeline.progress.eta), and each local base model's build line whenever it changes
(lorarl.build_progress: the build's SFT step, s/step and ETA):

    [lorarl] demo 12:03:41: 3/8 cells trained, 2 running; 410/640 steps (64%); ETA 4m50s (17 jobs left)
    [lorarl] base model tiny-arith: building, SFT step 412/800 (52%), 0.11 s/step, ETA 43s

It only reads the files the jobs write (display only: no job waits on it), and a failure to read them costs
one line, never the run. `output_lines` are the `onsuccess` lines naming each study's report and tables.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

from lorarl import paths

PREFIX = "[lorarl]"


def progress_line(s: dict) -> str:
    """One study's line from :func:`lorarl.pipeline.progress.watch.snapshot`."""
    from lorarl.pipeline.progress.watch import _fmt_s

    c = s["counts"]
    done = c.get("done", 0) + c.get("diverged", 0)
    parts = [f"{done}/{s['n']} cells trained"]
    parts += [f"{c[k]} {k}" for k in ("running", "queued", "failed", "diverged") if c.get(k)]
    total = s.get("steps_total", 0)
    steps = f"{total - s['steps_left']}/{total} steps ({100 * s['progress']:.0f}%)"
    jobs = sum((s.get("jobs_left") or {}).values())  # every job the run still executes (evaluations, ...)
    if s["ended"] and not jobs:
        eta = "training ended"
    elif s["eta_s"] is None:
        eta = "ETA ? (no step measured yet)"
    else:
        eta = (f"{'training ended; ' if s['ended'] else ''}ETA {'>= ' if s.get('eta_lower_bound') else ''}"
               f"{_fmt_s(s['eta_s'])}" + (f" ({jobs} jobs left)" if jobs else ""))
    return f"{PREFIX} {s['study']} {time.strftime('%H:%M:%S')}: {', '.join(parts)}; {steps}; {eta}"


class Progress:
    """Every `every` seconds, one line per study, and each local base model's build line when it changes (looked
    at every `base_every` seconds while one is unbuilt), until `stop()`. `studies`: study file paths; `recipes`:
    their local base models (lorarl.models.study_recipes); `snapshot(path, results) -> dict`: the study's state
    (lorarl.pipeline.progress.watch.snapshot). The first study line comes after `every` seconds: a run shorter than that
    computes no snapshot."""

    def __init__(self, studies: list[str], results: str | Path, every: float, recipes: list[str] | None = None,
                 out: TextIO = sys.stdout, snapshot: Callable[[str, str | Path], dict] | None = None,
                 base_every: float = 15.0):
        from lorarl.pipeline.progress.watch import snapshot as watch_snapshot

        self.studies, self.results, self.every, self.out = list(studies), results, float(every), out
        self.recipes = list(dict.fromkeys(recipes or []))
        self.snapshot = snapshot or watch_snapshot
        self.base_every = min(float(base_every), self.every)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bases: dict[str, str] = {}  # base model -> its line last printed

    def start(self) -> "Progress":
        self._thread = threading.Thread(target=self._run, name="lorarl-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def base_lines(self) -> list[str]:
        """The build line of each local base model not built yet, when it changed since it was last printed."""
        from lorarl.build_progress import base_lines

        out = []
        for line in base_lines(self.recipes, self.results) if self.recipes else []:
            name = line.split(":", 1)[0]
            if self._bases.get(name) != line:
                self._bases[name] = line
                out.append(f"{PREFIX} {line}")
        return out

    def study_lines(self) -> list[str]:
        lines = []
        for f in self.studies:
            try:
                lines.append(progress_line(self.snapshot(f, self.results)))
            except Exception as err:  # noqa: BLE001 (a display: a half-written file costs one line, not the run)
                lines.append(f"{PREFIX} {Path(f).stem}: progress unavailable ({type(err).__name__}: {err})"[:200])
        return lines

    def _run(self) -> None:
        next_study = time.monotonic() + self.every
        while not self._stop.is_set():
            try:
                lines = self.base_lines()
            except Exception:  # noqa: BLE001 (display only)
                lines = []
            if time.monotonic() >= next_study:
                next_study = time.monotonic() + self.every
                lines += self.study_lines()
            if lines:
                self.out.write("\n".join(lines) + "\n")
                self.out.flush()
            self._stop.wait(min(self.base_every, max(next_study - time.monotonic(), 0.0)))


def output_lines(study_names: list[str], results: str | Path) -> list[str]:
    """`onsuccess`: where each study's report, tables and figures are (those it has)."""
    out = []
    for name in study_names:
        table = paths.path("table_md", results=results, study=name)
        found = [("report ", Path(results) / name / "report.html"), ("table  ", table),
                 ("stats  ", table.with_name("stats.md")), ("figures", paths.path("figures", results=results, study=name))]
        out += [f"{PREFIX} {name} {what}: {p}{'/' if p.is_dir() else ''}" for what, p in found if p.exists()]
    return out
