"""How long a job takes to start: one line when its stage reaches its first real work.

`first_work("training step")` prints, once per process and kind of work,

    [lorarl] first training step: 14.21 s after the process started, 12.80 s of CPU (epoch 1767000000.123)

at the train stage's first step, the evaluate stage's first generation batch, the diagnose stage's first
diagnostic, the base stage's first SFT step and a pack's first step. Everything before it is start-up:
the interpreter, imports, reading the study, loading weights. The CPU seconds (all the process's threads) are
what a busy machine charges for it; the wall seconds grow with its load. `bench/job_start.py` reads these
lines from the jobs' logs; a user reads them in `results/<study>/<cell>/logs/<stage>/*_log.out`.

The job's one-off costs that the first step would otherwise pay (the grading workers' start, an inference
engine's start) are recorded here by `startup(what, seconds)`; `startup_s()` gives them, and a cell's run writes their
sum as `startup_s` on its first row of the job (its summary sums them over its jobs), outside every step's time.
"""

from __future__ import annotations

import os
import time

PREFIX = "[lorarl] first "  # what bench/job_start.py looks for
_printed: set[str] = set()
_startup: dict[str, float] = {}  # this process's one-off start-up costs, seconds by what paid them


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's start time); None where unknown."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: start time since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def first_work(what: str) -> None:
    """The line above, the first time this process reaches `what`; afterwards nothing."""
    if what in _printed:
        return
    _printed.add(what)
    from lorarl import ledger

    ledger.first_work()  # the cost ledger's start-up ends here too
    age = process_age_s()
    since = "?" if age is None else f"{age:.2f}"
    print(f"{PREFIX}{what}: {since} s after the process started, {time.process_time():.2f} s of CPU "
          f"(epoch {time.time():.3f})", flush=True)


def startup(what: str, seconds: float) -> None:
    """Record `seconds` of this job's start-up spent on `what` ("grading pool", "engine"), and print it."""
    _startup[what] = _startup.get(what, 0.0) + float(seconds)
    print(f"[lorarl] start-up: {what} {seconds:.2f} s", flush=True)


def startup_s() -> dict[str, float]:
    """The start-up seconds recorded so far in this process, by what paid them."""
    return dict(_startup)
