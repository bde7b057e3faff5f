"""CUDA out of memory: the workflow retries the job one rung down the memory ladder (lorarl.memory.ladder).

The train, evaluate and train_pack rules have `retries:`; Snakemake's attempt number reaches `lorarl launch`
as its `--attempt` (a rule resource: no param, so never a rerun trigger, never in a signature), the job's
parameter `attempt` (lorarl.pipeline.jobs.jobparams), passed to every function here that needs it. Then:

* launcher: an attempt's failure is recorded in `<stage log folder>/oom-attempts.json`; one that died of
  CUDA out of memory (:func:`is_oom`) exits with :data:`OOM_EXIT`, any other with 1. Attempt k > 1 is
  submitted only when attempt k-1 ran out of memory; otherwise it fails at once, repeating attempt k-1's
  error (a retry never hides the real failure; `lorarl status` shows it). The last attempt (4) of a training
  job runs on the profile's larger layout (``slurm.train.layouts.on_oom``, more ranks than the cell's; a pack
  job: more ranks than its own layout, so fewer members per rank, lorarl.pack.ranks), on the smallest settings;
  without one, and for evaluate jobs: "no larger layout allowed by the profile".
* job: :func:`job_for_attempt` hands the stage cells that run the attempt's rung (train/pack: `auto`
  resolved for the job first, then the rung's micro-batch, generation chunk, checkpointing; evaluate:
  eval.batch_size), each change printed; after success :func:`annotate` adds `"oom_retries"` (one entry per
  retry: attempt and the settings it ran) to the cell's summary.json (or the evaluation's summary) and the
  MLflow tag `lorarl.oom_retries` (`lorarl.oom_retries.<target>` for an evaluation).

Test hook: LORARL_FAULT="oom_above:N" makes a train / pack / evaluate job raise torch.OutOfMemoryError at
its start while its load exceeds N sequences: training, the micro-batch (half of it with gradient
checkpointing on: activations are what checkpointing saves); evaluation, eval.batch_size.
LORARL_FAULT="oom_ranks_below:N": a training (or pack) job of fewer than N ranks runs out of memory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from lorarl.faulthooks import number as fault_number
from lorarl.io import read_json, write_json
from lorarl.memory import ladder
from lorarl.memory.auto import world_size
from lorarl.pipeline.jobs.stages import get_stage

RECORD = "oom-attempts.json"  # in the stage's log folder: one entry per failed attempt
OOM_EXIT = 3  # `lorarl launch` exit status of an attempt that ran out of memory
MAX_ATTEMPTS = 4  # the rules' retries + 1: rungs 1-3, then the layout rung
_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "CUDA error: out of memory")


def is_oom(err: BaseException | str | None) -> bool:
    """A CUDA out-of-memory error: torch.OutOfMemoryError (also as the text of a job's traceback)."""
    while isinstance(err, BaseException):
        if type(err).__name__ == "OutOfMemoryError" or any(m in str(err) for m in _MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return isinstance(err, str) and any(m in err for m in _MARKERS)


# ---- launcher side --------------------------------------------------------------------------------

def before_attempt(folder: Path, key: str, target: str, n: int, larger: str | None = None) -> int | None:
    """None: submit attempt ``n`` (the job's ``--attempt``). Else the exit status of a retry that is not run
    (printed why). ``larger``:
    the larger layout the profile allows this job (train: ``slurm.train.layouts.on_oom``), said at the last
    attempt, which runs on it; None: there is none, and the last attempt is refused."""
    record = Path(folder) / RECORD
    if n == 1:
        record.unlink(missing_ok=True)
        return None
    entries = read_json(record) or []
    prev = next((e for e in entries if e.get("attempt") == n - 1), None)
    if prev is None:  # the launcher of that attempt left no record (it died): its own lines are all there is
        print(f"[lorarl] {key} {target}: attempt {n} not run: attempt {n - 1} left no out-of-memory record; "
              f"only out-of-memory failures are retried", file=sys.stderr, flush=True)
        return 1
    if not prev.get("oom"):  # the stage log holds only this attempt: repeat the failure, carry it to the next retry
        write_json(record, [e for e in entries if e.get("attempt") != n] + [{**prev, "attempt": n}])
        if prev.get("failed"):
            print(prev["failed"], file=sys.stderr)
        print(f"[lorarl] error: {prev['error']}", file=sys.stderr)
        print(f"[lorarl] {key} {target}: attempt {n} not run: attempt {n - 1} did not run out of memory; "
              f"only out-of-memory failures are retried", file=sys.stderr, flush=True)
        return 1
    if n > MAX_ATTEMPTS or (n == MAX_ATTEMPTS and larger is None):
        print(f"[lorarl] error: {prev['error']}", file=sys.stderr)
        print(f"[lorarl] {key} {target} FAILED: out of memory at attempt {n - 1} on the smallest settings; "
              f"attempt {n} would need a larger layout: "
              f"{ladder.NO_LAYOUT if n == MAX_ATTEMPTS else 'the larger layout ran out of memory too'}",
              file=sys.stderr, flush=True)
        return 1
    if n == MAX_ATTEMPTS:
        print(f"[lorarl] {key} {target}: attempt {n} after out of memory in attempt {n - 1} ({prev['error'][:300]}): "
              f"retrying on the larger layout the profile allows: {larger} (the smallest settings)", flush=True)
        return None
    print(f"[lorarl] {key} {target}: attempt {n} after out of memory in attempt {n - 1} ({prev['error'][:300]}): "
          f"retrying one rung down the memory ladder (lorarl.memory.ladder)", flush=True)
    return None


def after_failure(folder: Path, error: str, n: int, failed: str | None = None) -> int:
    """Record the failure of attempt ``n`` (``failed``: the launcher's FAILED line, repeated by refused retries);
    the launcher's exit status (OOM_EXIT for out of memory)."""
    oom = is_oom(error)
    record = Path(folder) / RECORD
    entries = [e for e in read_json(record) or [] if e.get("attempt") != n]
    write_json(record, entries + [{"attempt": n, "oom": oom, "error": error[:1000], "failed": failed}])
    return OOM_EXIT if oom else 1


# ---- job side -------------------------------------------------------------------------------------

def fault_threshold() -> int | None:
    """Test hook LORARL_FAULT=oom_above:N (the module docstring)."""
    return fault_number("oom_above")


def fault_ranks() -> int | None:
    """Test hook LORARL_FAULT=oom_ranks_below:N: a training job of fewer than N ranks runs out of memory (a
    model that fits only when sharded over N GPUs)."""
    return fault_number("oom_ranks_below")


def _ranks_of(k: int) -> dict[str, int]:
    """The layout an attempt's record names: the last attempt's ranks (it ran on the larger layout)."""
    return {"ranks": world_size()} if k == MAX_ATTEMPTS else {}


def _raise_oom(what: str, load: float, limit: int) -> None:
    import torch

    raise torch.OutOfMemoryError(f"CUDA out of memory: {what} {load:g} sequences > {limit} "
                                 f"(test hook LORARL_FAULT=oom_above:{limit})")


class _LadderTable:
    """The study's cell table, its cells running this attempt's rung (ids and hashes unchanged)."""

    def __init__(self, table: Any, stage: str, n: int, results_dir: str):
        self._table, self.stage, self.n, self.results_dir = table, stage, n, results_dir
        self.retries: dict[str, list[dict]] = {}  # cell id -> its "oom_retries" entries

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    def cell(self, cell_id: str) -> Any:
        cell = self._table.cell(cell_id)
        cfg, limit = cell.config, fault_threshold()
        spec = get_stage(self.stage)
        if spec.oom_retry == "eval":
            steps = ladder.eval_ladder(cfg.eval.batch_size, cfg.eval.backend)
            size = ladder.rung(steps, self.n)
            self.retries[cell.id] = [{"attempt": k, "eval.batch_size": steps[k - 1]} for k in range(2, self.n + 1)]
            if size != cfg.eval.batch_size:
                print(f"[lorarl] out-of-memory retry, attempt {self.n}: {cell.id}: eval.batch_size "
                      f"{cfg.eval.batch_size} -> {size}", flush=True)
                cfg = ladder.eval_config(cfg, size)
            if limit is not None and size > limit:
                _raise_oom("eval.batch_size", size, limit)
            return replace(cell, config=cfg)
        import torch

        from lorarl.memory.auto import resolve_job

        device = "cuda" if torch.cuda.is_available() else "cpu"
        cfg = resolve_job(cfg, results_dir=self.results_dir, world=1 if spec.members else None)  # a member alone
        steps = ladder.train_ladder(ladder.planned_train(cfg, device))
        # the last attempt runs on the profile's larger layout (the launcher refuses it without one), on the
        # smallest settings; the other attempts run their rung
        at = [len(steps) if k == MAX_ATTEMPTS else k for k in range(1, self.n + 1)]
        r = ladder.rung(steps, at[-1])
        self.retries[cell.id] = [{"attempt": k, **steps[i - 1].record(), **_ranks_of(k)}
                                 for k, i in enumerate(at, 1) if k > 1]
        if self.n > 1:
            print(f"[lorarl] out-of-memory retry, attempt {self.n}: {cell.id}: "
                  + ", ".join(f"{k} {a} -> {b}" for (k, a), b in zip(steps[0].record().items(), r.record().values())
                              if a != b)
                  + (f"; on the larger layout: {world_size()} rank(s)" if self.n == MAX_ATTEMPTS else ""), flush=True)
            cfg = ladder.train_config(cfg, r)
        load = r.micro_batch_size / (2 if r.gradient_checkpointing else 1)
        if limit is not None and load > limit:
            _raise_oom("micro-batch" + (" (halved by checkpointing)" if r.gradient_checkpointing else ""), load, limit)
        if (need := fault_ranks()) is not None and world_size() < need:
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory: {world_size()} rank(s) < {need} "
                                         f"(test hook LORARL_FAULT=oom_ranks_below:{need})")
        return replace(cell, config=cfg)


def job_for_attempt(stage: str, job: Any) -> Any:
    """``job`` whose cells run the rung of its attempt (``job.params.attempt``; unchanged at attempt 1 without
    the fault hook)."""
    n = job.params.attempt
    if get_stage(stage).oom_retry and (n > 1 or fault_threshold() is not None or fault_ranks() is not None):
        job._table = _LadderTable(job.table, stage, n, job.results_dir)
    return job


def annotate(stage: str, job: Any) -> None:
    """After a successful retry: ``oom_retries`` into each retried cell's summary and MLflow run."""
    table = job._table
    if not isinstance(table, _LadderTable) or table.n == 1:
        return
    from lorarl import paths

    study, spec = job.study.name, get_stage(stage)
    for cell_id, entries in table.retries.items():
        cdir = paths.cell_dir(job.results_dir, study, cell_id)
        if spec.oom_retry == "eval":
            from lorarl.evaluate.main import requested_targets
            from lorarl.language.evalplan.plan import format_target

            cell = table._table.cell(cell_id)
            wanted = [t for t in job.params.eval_target.split(",") if t.strip()]  # the job's --eval-target
            for bench, step in requested_targets(cell.config, table._table.is_base(cell_id), wanted):
                target = format_target(bench, step)
                _add(cdir / "eval" / f"{target}.json", entries)
                _tag(job.results_dir, study, cdir, f"lorarl.oom_retries.{target.replace('@', '_at_')}", entries)
            continue
        summary = cdir / (".packed/summary.json" if spec.members else "summary.json")  # a pack's member: staged
        if _add(summary, entries):
            _tag(job.results_dir, study, cdir, "lorarl.oom_retries", entries, summary)


def _add(path: Path, entries: list[dict]) -> bool:
    data = read_json(path)
    if not isinstance(data, dict):
        return False
    write_json(path, {**data, "oom_retries": entries})
    print(f"[lorarl] out-of-memory retries recorded in {path}: {json.dumps(entries)}", flush=True)
    return True


def _tag(results_dir: str, study: str, cdir: Path, key: str, entries: list[dict], summary: Path | None = None) -> None:
    """The cell's MLflow run (a trained cell's, or the base pseudo-cell's) gets the retries as a tag."""
    run = (read_json(summary or cdir / "summary.json") or read_json(cdir / "mlflow_run.json") or {})
    run_id = run.get("mlflow_run_id") or run.get("run_id")
    if not run_id:
        return
    try:
        from lorarl.tracking.client import Tracker

        tracker = Tracker(results_dir, study)
        tracker.run_id = run_id
        tracker.set_tags({key: json.dumps(entries)})
    except Exception as err:  # noqa: BLE001 - the summary is the record; a tag must never fail the job
        print(f"[lorarl] MLflow tag {key}: {type(err).__name__}: {err}", file=sys.stderr)
