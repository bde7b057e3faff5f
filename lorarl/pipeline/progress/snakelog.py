"""Snakemake's console lines, named: each finished job says its study and cell, and a dry run's summary points
only at lines the profile shows.

profiles/default is quiet about rules (no block of paths per job, a 1,000-cell study stays readable), which
left Snakemake's progress lines anonymous ("Finished jobid: 14 (Rule: train)") and its dry-run summary
pointing at per-job lines that were hidden ("Reasons: (check individual jobs above for details)", after the
same "Job stats" table twice). `JobNames`, a `logging.Filter` on Snakemake's logger installed by
workflow/rules/common.smk, reads each job's wildcards from its job-info record (emitted for every job,
whether shown or not) and:
* appends them to the job's "Finished jobid" line: `Finished jobid: 14 (Rule: train): demo/r8-kl0.05-s1`;
* when rules are quiet: drops a dry run's second, identical "Job stats" table, and replaces the pointer to
  the hidden job lines with how to see them (`--quiet host` on the command line, as docs/studies.md says).
Records are matched by their `event` (snakemake_interface_logger_plugins' LogEvent, the logger-plugin
interface); any other record passes untouched.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from snakemake_interface_logger_plugins.common import LogEvent  # Snakemake's logger-plugin interface

HIDDEN_POINTER = "(check individual jobs above for details)"
SHOWN_POINTER = "(each job with its reason: the same command with `--quiet host`)"


def label(wildcards: dict[str, Any] | None) -> str:
    """A job's name from its wildcards: `demo/r8-kl0.05-s1`, `demo/base synthetic@3`, `models/tiny-arith`,
    `demo/r8-kl0.05-s1 to step 10`, `demo rung 10 (all)`, `demo r16_vs_full look 4`."""
    w = {k: str(v) for k, v in (wildcards or {}).items()}
    if "name" in w and "study" not in w:
        return f"models/{w['name']}"
    parts = [w[k] for k in ("study", "cell") if k in w]
    text = "/".join(parts)
    if "pack" in w:
        text += f"/pack {w['pack']}"
    if "benchmark" in w:
        text += f" {w['benchmark']}" + (f"@{w['step']}" if "step" in w else "")
    elif "hypothesis" in w:  # an adaptive study's decisions (workflow/rules/adaptive.smk)
        text += f" {w['hypothesis']} look {w.get('n', '')}"
    elif "tag" in w:
        text += f" rung {w.get('step', '')} ({w.get('n', '')})"
    elif "step" in w:  # a segment trained up to a rung
        text += f" to step {w['step']}"
    return text


class JobNames(logging.Filter):
    """Names each finished job by its wildcards; a dry run's summary without pointers to hidden lines."""

    def __init__(self, rules_quiet: bool, dryrun: Callable[[], bool]):
        super().__init__()
        self.rules_quiet, self.dryrun = rules_quiet, dryrun  # dryrun: asked when it matters (unknown at parse time)
        self.names: dict[Any, str] = {}  # jobid -> label
        self.stats: str | None = None  # the last "Job stats" table printed

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "event", None)
        msg = record.msg if isinstance(record.msg, str) else ""
        if event == LogEvent.JOB_INFO:
            name = label(getattr(record, "wildcards", None))
            if name:
                self.names[getattr(record, "jobid", None)] = name
        elif event == LogEvent.JOB_FINISHED:
            name = self.names.get(getattr(record, "job_id", None))
            if name and msg.startswith("Finished jobid") and not msg.endswith(name):
                record.msg = f"{msg}: {name}"
        elif self.rules_quiet and event == LogEvent.RUN_INFO and msg.startswith("Job stats") and self.dryrun():
            if msg == self.stats:
                return False  # the same table again: nothing was shown between the two
            self.stats = msg
        elif self.rules_quiet and msg.startswith("Reasons:") and HIDDEN_POINTER in msg:
            record.msg = msg.replace(HIDDEN_POINTER, SHOWN_POINTER)
        return True


def install(logger: logging.Logger, quiet: Iterable[Any] | None, dryrun: Callable[[], bool]) -> JobNames:
    """Put one JobNames on Snakemake's logger (a Snakefile parsed again in one process replaces it). `dryrun`
    answers whether this is a dry run (Snakemake knows only once its executor is set up, after parsing)."""
    for old in [f for f in logger.filters if isinstance(f, JobNames)]:
        logger.removeFilter(old)
    names = {str(getattr(q, "name", q)).lower() for q in (quiet or ())}
    f = JobNames(rules_quiet=bool(names & {"rules", "all"}), dryrun=dryrun)
    logger.addFilter(f)
    return f
