"""Snakemake's console lines under the default profile (quiet about rules): each finished job names its study
and cell, and a dry run's summary neither repeats its job table nor points at job lines the profile hides
(lorarl.pipeline.progress.snakelog). Records go through Snakemake's own filter and formatter, as on the console."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

from snakemake.logging import DefaultFilter, DefaultFormatter
from snakemake.settings.enums import Quietness
from snakemake_interface_logger_plugins.common import LogEvent

from lorarl.pipeline.drills import recovery
from lorarl.pipeline.progress.snakelog import HIDDEN_POINTER, SHOWN_POINTER, install, label

QUIET = {Quietness.RULES, Quietness.HOST, Quietness.REASON}  # profiles/default/config.yaml


def console(quiet: set, dryrun: bool) -> tuple[logging.Logger, io.StringIO]:
    logger = logging.getLogger(f"snakelog-test-{len(quiet)}-{dryrun}")
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(DefaultFilter(quiet, False, False, dryrun, False))
    handler.setFormatter(DefaultFormatter(quiet))
    logger.addHandler(handler)
    install(logger, quiet, lambda: dryrun)
    return logger, out


def job(logger: logging.Logger, jobid: int, rule: str, **wildcards: str) -> None:
    """What Snakemake logs for a job: its info record (hidden by `quiet: rules`), then its end."""
    logger.info(f" Rule: {rule}, Jobid: {jobid}", extra=dict(event=LogEvent.JOB_INFO, jobid=jobid, rule_msg=None,
                rule_name=rule, local=False, input=[], output=[], log=[], benchmark=None, wildcards=wildcards,
                reason="", resources={}, priority=0, threads=1, indent=False, is_checkpoint=False,
                printshellcmd=False, is_handover=False, shellcmd=""))
    logger.info(f"Finished jobid: {jobid} (Rule: {rule})", extra=dict(event=LogEvent.JOB_FINISHED, job_id=jobid))


def test_finished_lines_name_study_and_cell():
    logger, out = console(QUIET, dryrun=False)
    job(logger, 14, "train", study="demo", cell="r8-kl0.05-s1")
    job(logger, 15, "evaluate_step", study="demo", cell="base", benchmark="synthetic", step="3")
    job(logger, 2, "base_model", name="tiny-arith")
    lines = [line for line in out.getvalue().splitlines() if line.startswith("Finished")]
    assert lines == ["Finished jobid: 14 (Rule: train): demo/r8-kl0.05-s1",
                     "Finished jobid: 15 (Rule: evaluate_step): demo/base synthetic@3",
                     "Finished jobid: 2 (Rule: base_model): models/tiny-arith"]
    assert "Rule: train, Jobid" not in out.getvalue()  # the job blocks stay hidden
    assert label({"study": "demo", "pack": "p1"}) == "demo/pack p1" and label({"study": "demo"}) == "demo"
    # an adaptive study's segments and decisions (workflow/rules/adaptive.smk)
    assert label({"study": "demo", "cell": "r8-s1", "step": "10"}) == "demo/r8-s1 to step 10"
    assert label({"study": "demo", "tag": "search-0123456789", "step": "10", "n": "all"}) == "demo rung 10 (all)"
    assert label({"study": "demo", "tag": "hyp-0123456789", "hypothesis": "h1", "n": "4"}) == "demo h1 look 4"


def test_a_dry_run_summary_points_at_no_hidden_line():
    stats = "Job stats:\njob    count\n-----  -----\ntrain  8\ntotal  8\n"
    reasons = f"Reasons:\n    {HIDDEN_POINTER}\n    output files have to be generated:\n        train"
    for quiet, shown in ((QUIET, True), ({Quietness.HOST}, False)):  # the profile; `--quiet host` shows the jobs
        logger, out = console(quiet, dryrun=True)
        logger.info(stats, extra=dict(event=LogEvent.RUN_INFO, stats={}))
        job(logger, 1, "train", study="demo", cell="r1-s0")
        logger.info(stats, extra=dict(event=LogEvent.RUN_INFO, stats={}))
        logger.info(reasons)
        text = out.getvalue()
        assert text.count("Job stats:") == (1 if shown else 2)
        assert (SHOWN_POINTER in text) == shown and (HIDDEN_POINTER in text) != shown


def test_snakemake_dry_run_of_the_demo(tmp_path: Path):
    """The real thing: `snakemake -n all` with the default profile prints one job table and no pointer to
    hidden job lines."""
    root = recovery.workspace(tmp_path, {"studies": [str(Path(recovery.REPO) / "experiments" / "demo.yaml")]})
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["snakemake", "-n", "all"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert text.count("Job stats:") == 1 and SHOWN_POINTER in text and HIDDEN_POINTER not in text, text[-3000:]
    assert not (root / "results").exists()
