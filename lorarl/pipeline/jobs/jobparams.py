"""A job's parameters: what one job of a stage is asked to do beyond its stage, study and target.

They are arguments of the job's command line (``lorarl launch <stage> <study> <target> --attempt N --until S
--places P --update-cells U --eval-target T --pack-id ID --invocation I``), written by the Snakemake rules from the plan
(workflow/rules/*.smk), parsed once by ``lorarl launch`` (:func:`add_arguments`, :func:`from_args`) into one
:class:`JobParams`, and handed down explicitly: to the launcher (its out-of-memory retries, output check and
provenance), inside the submitted job (``StageJob`` pickles it, so a requeued job keeps it), to the stage
(``Job.params``, lorarl.pipeline.jobs.stages) and from there as plain arguments to the code that uses them. No job
parameter travels in the environment (the ``LORARL_*`` variables that remain are user knobs, test hooks and one
value a job sets for itself: the table in docs/contributing.md).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

__all__ = ["JobParamError", "JobParams", "add_arguments", "from_args"]

PACK_ID = re.compile(r"pack-[0-9a-f]{10}")  # lorarl.pack.plan.pack_id's form (the rule's wildcard constraint too)


class JobParamError(ValueError):
    """A job parameter out of range or missing (`lorarl launch` exits 2 on it, before anything is written)."""


@dataclass(frozen=True)
class JobParams:
    """One job's parameters (the module doc); the defaults are a plain job: first attempt, to the end, fixed pack."""

    attempt: int = 1  # Snakemake's attempt number: retry k after an out-of-memory failure runs rung k of the ladder
    until: int | None = None  # the training step a train/pack job stops at (an adaptive study's rung); None: the end
    places: int | None = None  # a resident pack job's places (`pack: {resident: true, places: P}`); None: fixed pack
    update_cells: int | None = None  # a pack's cells per backward pass (`pack: {update_cells}`, memory); None: all
    eval_target: str = ""  # the benchmark[@step] list one evaluate job runs (comma list); "": all of the cell's
    invocation: str | None = None  # the `snakemake` run that submitted the job (provenance, study/last_run_wall_time_s)
    pack_id: str | None = None  # a pack job's id, the hosting plan's (its record, logs, members' hand-over); None: not a pack

    def __post_init__(self) -> None:
        for name in ("attempt", "until", "places", "update_cells"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise JobParamError(f"job parameter {name}={value!r}: allowed: a whole number >= 1"
                                 + ("" if name == "attempt" else " (or none)"))
        if self.pack_id is not None and not PACK_ID.fullmatch(self.pack_id):
            raise JobParamError(f"job parameter pack_id={self.pack_id!r}: allowed: pack-<10 hex digits> (the plan's id)")

    def require_pack_id(self) -> str:
        """A pack job's id: the plan's, passed by its rule (never computed again by the job)."""
        if self.pack_id is None:
            raise JobParamError("job parameter pack_id missing: a pack job needs --pack-id=pack-<10 hex digits> "
                             "(workflow/rules/pack.smk passes the hosting plan's id)")
        return self.pack_id


def _count(flag: str, optional: bool, least: int = 1):
    """An argparse type: a whole number >= ``least`` (``optional``: or empty, meaning none)."""

    def parse(raw: str) -> int | None:
        raw = raw.strip()
        if optional and not raw:
            return None
        if not raw.isdigit() or int(raw) < least:
            raise argparse.ArgumentTypeError(f"{flag} {raw!r}: allowed: a whole number >= {least}"
                                             + (" (or empty: none)" if optional else ""))
        return int(raw)

    return parse


def _pack_id(raw: str) -> str | None:
    raw = raw.strip()
    if raw and not PACK_ID.fullmatch(raw):
        raise argparse.ArgumentTypeError(f"--pack-id {raw!r}: allowed: pack-<10 hex digits> (the plan's id)")
    return raw or None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The job parameters as options of ``lorarl launch`` (the rules pass them; empty = none)."""
    parser.add_argument("--attempt", type=_count("--attempt", False), default=1,
                        help="Snakemake's attempt number (out-of-memory retries, lorarl.pipeline.jobs.oom)")
    parser.add_argument("--until", type=_count("--until", True), default=None,
                        help="train/pack: the step the job stops at (an adaptive study's rung); empty: the end")
    parser.add_argument("--places", type=_count("--places", True), default=None,
                        help="pack: a resident pack job's places; empty: a fixed pack")
    parser.add_argument("--update-cells", type=_count("--update-cells", True, least=0), default=None,
                        help="pack: cells per backward pass (pack.update_cells); 0 or empty: all of them")
    parser.add_argument("--eval-target", default="",
                        help="evaluate: comma list of benchmark[@step] this job runs; empty: all of the cell's")
    parser.add_argument("--invocation", default=None, help="the `snakemake` run submitting the job (provenance)")
    parser.add_argument("--pack-id", type=_pack_id, default=None, help="pack: the job's id in the hosting plan (pack-<10 hex>)")


def from_args(args: argparse.Namespace) -> JobParams:
    return JobParams(attempt=args.attempt, until=args.until, places=args.places, update_cells=args.update_cells or None,
                     eval_target=(args.eval_target or "").strip(), invocation=args.invocation or None,
                     pack_id=args.pack_id)
