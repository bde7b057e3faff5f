"""One cell's run, whatever hosts it: written once, used by the solo job, the pack and (later) the resident pack.

    run = CellRun(study, cell, results_dir, cfg)             # the cell's lock, its checkpoint folder
    if run.done: return run.done                             # its outputs in place: another job finished it
    run.start(precision)                                     # MLflow run (new, or the checkpoint's reopened), rows so far
    run.watch(policy.save, tokenizer, snapshot_steps)        # snapshots, collapse and divergence monitors
    ... the host trains: HF's Trainer with run.callbacks() + run.attach(trainer) + run.train(trainer) (solo), or
        a step loop calling run.step_done(step, row, model) and run.checkpoint(step, write_state) (the pack) ...
    return run.finish(policy, model, facts=...)              # adapter, summary, MLflow, cell.json, publish
                                                             # (or, stopped at ``stop_at``: run.pause())

What the run owns: the cell's lock and checkpoints (:class:`lorarl.train.checkpoint.CellCheckpoints`; on ranks
other than 0 a :class:`lorarl.train.rank_checkpoints.FollowerCheckpoints`), its MLflow run, the metrics
recorder (metrics.csv + MLflow), the divergence and collapse monitors, snapshots (``eval.eval_every``), the
summary, ``cell.json`` and the atomic publish: in place (``os.replace`` each output, ``summary.json`` last), or
``stage`` (a pack job stages its members' outputs for their own ``train`` jobs: lorarl.pack.publish). What the
host owns: the models, the trainer and the loop; it hands the run each step's row and a writer of the engine's
state at a checkpoint (lorarl.train.cellstate says what a checkpoint holds).

Paused (``stop_at``, a runtime choice, never in a signature): the run saves its full state at that training
step (even without ``train.checkpoint_every``), publishes nothing and ends "paused": ``paused.json`` in the
checkpoint folder, its MLflow run ended with the tag ``lorarl.state=paused``, the lock released. The next run of
the cell, in any host of the same engine (a solo job, any pack position), resumes from it into the same MLflow
run, and ends where the uninterrupted run ends. A host that admits cells into slots of a running job opens a run
per admitted cell (``CellRun`` + ``start``, its engine state loaded when ``run.resumed``) and evicts one between
steps with ``run.stop_at(step)`` then ``run.finish(...)`` (paused) or lets it finish; no run refers to another.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from lorarl import paths
from lorarl.io import write_json
from lorarl.train import cellstate, ranks, salvage



class CellRun:
    """One cell's run: lock + checkpoints, MLflow run, recorder, monitors, snapshots, summary, cell.json, publish."""

    def __init__(self, study: str, cell: Any, results_dir: str | Path, cfg: Any, *, engine: str = "hf",
                 main: bool = True, stage: Callable[[Path, Path], Any] | None = None, holder: str = "",
                 lock_wait_s: float | None = None, stop_at: int | None = None, t_start: float | None = None,
                 invocation: str | None = None):
        """``cfg``: the config the run trains with (written into cell.json). ``engine``: whose state its checkpoints
        hold ("hf": the solo trainer, "pack": the step loop). ``stage``: publish by handing the work folder to it
        (the pack's staging), else in place. ``holder``/``lock_wait_s``: the lock (lorarl.train.checkpoint).
        ``stop_at``: end paused at this training step (None: train to ``train.steps``). ``invocation``: the Snakemake
        run of the job (its kept outputs, lorarl.train.salvage, are put back only for that run's reasons)."""
        from lorarl.train.checkpoint import CellCheckpoints
        from lorarl.numerics.divergence import Divergence
        from lorarl.train.rank_checkpoints import FollowerCheckpoints

        self.study, self.cell, self.results_dir, self.cfg, self.main = study, cell, results_dir, cfg, main
        self.invocation = invocation
        self.t_start = time.time() if t_start is None else t_start
        self.per = int(cfg.train.updates_per_step)  # optimiser updates per training step (HF's global steps)
        self.final = paths.cell_dir(results_dir, study, cell.id)
        self.stage = stage
        self.work = self.final / (".pack.tmp" if stage is not None else ".train.tmp")
        self.ckpt = (CellCheckpoints(results_dir, study, cell, lock_wait_s=lock_wait_s, holder=holder, fmt=engine)
                     if main else FollowerCheckpoints(results_dir, study, cell))
        self.ckpt.stop_at = None
        if stop_at is not None:
            self.stop_at(stop_at)
        self.ckpt.monitors = self.monitor_state
        if not main:  # a follower rank learns rank 0's pause (lorarl.train.rank_checkpoints)
            self.ckpt.paused, self.ckpt.max_steps = None, int(cfg.train.steps) * self.per
        self.divergence = Divergence(self.per)  # NaN/inf loss, reward or gradient: stop, state "diverged"
        self.collapse_at: int | None = None  # train.stop_on_collapse: the step a collapse flag stopped the cell
        self.host_state: Callable[[], dict] = dict  # the host's monitors (adv_std_peak, freshness) for a checkpoint
        self.tracker = self.run_id = self.recorder = self.snapshots = self.precision = None
        self.monitors: dict = {}  # the resumed checkpoint's monitor state (lorarl.train.cellstate)
        self.collapse_monitor: Any = None  # the HF host's collapse callback (lorarl.train.flags.monitor)
        self.done = ranks.broadcast(self._finished_meanwhile() if main else None)
        if main and self.done is None:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work.mkdir(parents=True)

    # ---- opening ------------------------------------------------------------------------------------
    def _finished_meanwhile(self) -> dict | None:
        """The summary of a cell whose outputs of this config are in place by the time this job holds its lock (the
        job it waited for finished it, or a lost launcher's job that started late finds a rerun finished it), or were
        kept aside from a killed run's finished job (lorarl.train.salvage): nothing to train. Otherwise never the
        case for a job Snakemake runs on its own outputs: it removes them before the job starts."""
        try:
            summary = json.loads((self.final / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None
        how = "by the job this one waited for" if self.ckpt.waited_for_lock else "already, by another job"
        if not isinstance(summary, dict) or summary.get("config_hash") != self.cell.hash:
            # a job of a killed Snakemake finished it and the rerun removed its outputs (lorarl.train.salvage)
            summary = salvage.restore(self.results_dir, self.study, self.cell.id, self.cell.hash, self.invocation)
            how = "by a job of a killed Snakemake run (the outputs Snakemake removed are back in place)"
        if summary is None:
            return None
        print(f"[lorarl] cell {self.cell.id} was trained {how} (its outputs of this config are in place); nothing to "
              f"do", flush=True)
        self.ckpt.release()
        return summary

    def start(self, precision: str, *, params: dict | None = None, tags: dict | None = None) -> str | None:
        """The cell's MLflow run (the checkpoint's, reopened, or a new one) and its recorder with the rows trained
        before a resume (MLflow gets any it missed); the monitors as the checkpoint left them."""
        from lorarl.tracking.client import Tracker
        from lorarl.train.callbacks import MetricsRecorder

        c, run_id, self.precision = self.cell, None, precision
        if self.main:
            self.tracker = Tracker(self.results_dir, self.study)
            run_id = self.ckpt.resume_run(self.tracker) or self.tracker.start(  # a requeued/killed cell reopens its run
                c.id, run_name=c.id,
                tags={"lorarl.config_hash": c.hash, **(tags or {}), **{f"axis.{k}": v for k, v in c.axes.items()}},
                params={**c.flat_config(), "train.precision_resolved": precision, **(params or {})})
            (self.ckpt.root / cellstate.PAUSED).unlink(missing_ok=True)  # a paused run goes on
        self.run_id, resume_from = ranks.broadcast((run_id, self.ckpt.resume_from))  # every rank: rank 0's choice
        if not self.main:
            self.ckpt.resume_from = resume_from
        self.recorder = MetricsRecorder(self.work / "metrics.csv", self.tracker, updates_per_step=self.per,
                                        write=self.main)
        self.ckpt.restore(self.recorder, self.run_id)
        _tag_provenance(self.tracker)
        self.monitors = ranks.broadcast(self.resumed.meta.get("monitors", {}) if self.resumed else {})
        self.collapse_at = cellstate.apply_monitors(self.monitors, self.divergence)
        return self.run_id

    @property
    def resumed(self) -> Any:
        """The checkpoint this run resumed from (lorarl.train.checkpoint.Checkpoint; rank 0 only), or None."""
        return getattr(self.ckpt, "resumed", None)

    def watch(self, save: Callable[..., Any], tokenizer: Any, steps: Any) -> None:
        """Snapshots (``save``: the adapter's, at ``steps``) and the collapse monitor."""
        from lorarl.train import flags
        from lorarl.train.snapshots import SnapshotSaver

        self.snapshots = SnapshotSaver(self.final / "snapshots", steps, save, tokenizer, updates_per_step=self.per)
        self.collapse_monitor = flags.monitor(self.recorder, self.cfg.train.stop_on_collapse, self.per)

    def ready(self) -> None:
        """Before this job's first step: wait for the grading workers the job started beside its model load
        (lorarl.grading.pool.wait_started); the job's start-up seconds so far (that wait, an engine's start:
        lorarl.jobclock) go on this job's first row as ``time/startup_s``, never into a step's time."""
        from lorarl import jobclock
        from lorarl.grading.pool import wait_started

        wait_started()
        self.recorder.startup_s = round(sum(jobclock.startup_s().values()), 3)

    # ---- a host with a step loop (the pack) ---------------------------------------------------------
    def step_done(self, step: int, row: dict, model: Any, update_refused: bool = False) -> str:
        """One training step's metrics row: recorded (metrics.csv, MLflow: live, then its own key), the
        monitors updated, the snapshot saved. Returns what the cell does next: "running", "diverged" (a
        non-finite metric, or ``update_refused``: its update was not applied), "stopped" (a collapse flag with
        ``train.stop_on_collapse``) or "paused" (``stop_at``)."""
        from lorarl.train import flags

        rec = self.recorder
        full = {"step": step, **{k: float(v) for k, v in row.items()}, "step_time_s": float(row.get("time/step_s", 0.0))}
        rec.record(full)  # start-up stamped on its first row; metrics.csv, MLflow (live now, its own key at a checkpoint)
        state = "running"
        if update_refused:
            self.divergence._mark(step, "non-finite loss or gradient (update skipped)")
            state = "diverged"
        elif self.divergence.check_row(row, step):
            state = "diverged"  # a NaN reward/metric: this cell stops (in a pack the others go on)
        if state == "running" and self.cfg.train.stop_on_collapse and flags.detect(rec.rows):
            state, self.collapse_at = "stopped", step
        if step in self.snapshots.steps:
            self.snapshots.save_step(step, model)
        if state == "running" and self.ckpt.stop_at is not None and self.ckpt.stop_at <= step * self.per < self.ckpt.max_steps:
            state = "paused"
        return state

    def stop_at(self, step: int) -> None:
        """End paused at training step ``step`` (this step or a later one): a host that evicts the cell between
        steps (a resident pack freeing a slot, an adaptive rung) calls it before that step's :meth:`checkpoint`."""
        self.ckpt.stop_at = int(step) * self.per

    def paused_before(self, step: int) -> bool:
        """A cell resumed at training step ``step``, already at (or past) its ``stop_at``: it pauses without a step."""
        stop, at = self.ckpt.stop_at, int(step) * self.per
        if stop is not None and stop <= at < self.ckpt.max_steps and self.ckpt.paused is None:
            self.ckpt.paused = at
        return self.ckpt.paused is not None

    def checkpoint(self, step: int, write_state: Callable[[Path], None], force: bool = False) -> bool:
        """After a step: progress, and a checkpoint when due (``train.checkpoint_every``, the last step, a pause,
        a preemption, or ``force``: the cell stopped). ``write_state(folder)`` writes the engine's files; the mark
        (lorarl.json) comes last. True when the HOST must stop (a preemption: every member checkpointed)."""
        from types import SimpleNamespace

        state = SimpleNamespace(global_step=step * self.per, max_steps=self.ckpt.max_steps)
        control = SimpleNamespace(should_save=False, should_training_stop=False)
        self.ckpt._on_step_end(state, control)
        if (self.ckpt.enabled or self.ckpt.paused is not None) and (control.should_save or force):
            write_state(self.ckpt.root / f"checkpoint-{step * self.per}")
            self.ckpt._on_save(state)  # lorarl.json (rows, manifest, monitors) LAST: the mark of a complete checkpoint
            self.recorder.flush()  # MLflow sees the steps only once a checkpoint covers them
        return bool(self.ckpt.stopped_for_preemption)

    # ---- a host on HF's Trainer (the solo job): lorarl.train.hf_host ---------------------------------
    def callbacks(self, sharded: bool = False) -> list:
        """The trainer's callbacks for this run (:func:`lorarl.train.hf_host.callbacks`)."""
        from lorarl.train import hf_host

        return hf_host.callbacks(self, sharded)

    def attach(self, trainer: Any, sharded: bool = False) -> None:
        """Wire the run into a built trainer (:func:`lorarl.train.hf_host.attach`)."""
        from lorarl.train import hf_host

        hf_host.attach(self, trainer, sharded)

    def train(self, trainer: Any) -> None:
        """Train, resumed from the run's checkpoint (:func:`lorarl.train.hf_host.train`)."""
        from lorarl.train import hf_host

        hf_host.train(self, trainer)

    # ---- the end ------------------------------------------------------------------------------------
    @property
    def paused_at(self) -> int | None:
        """The training step the run stopped at for ``stop_at`` (None: it trained on, or stopped for another reason:
        a cell that diverged or collapsed at that step is finished, not paused)."""
        if self.ckpt.paused is None or self.divergence.step is not None or self.collapse_at is not None:
            return None
        return -(-int(self.ckpt.paused) // self.per)

    def collapse_step(self) -> int | None:
        """The collapse stop: the HF host's monitor callback's, else the step loop's (or the resumed checkpoint's)."""
        hf = getattr(self.collapse_monitor, "stopped_at", None)
        return hf if hf is not None else self.collapse_at

    def monitor_state(self) -> dict:
        return cellstate.monitor_state(self.divergence, self.collapse_step(), self.host_state())

    def fail(self, err: BaseException) -> None:
        if self.tracker is not None and self.run_id is not None:  # ended before the lock goes: never taken for dead
            stopped = isinstance(err, (SystemExit, KeyboardInterrupt))  # a preemption, a requeue, a cancel
            self.tracker.finish("KILLED" if stopped else "FAILED", state="preempted" if stopped else "failed")
        self.ckpt.release()

    def finish(self, policy: Any, model: Any, *, facts: dict, state_dict: dict | None = None, tokenizer: Any = None,
               extra: dict | None = None) -> dict:
        """The cell's outputs: adapter (the policy's own save), summary.json, the MLflow summary, cell.json, all
        published at once (summary.json last); then its checkpoints go. A run stopped at ``stop_at`` pauses instead
        (:meth:`pause`). Ranks other than 0 write nothing and return ``{"cell", "rank"}``."""
        if self.paused_at is not None:
            return self.pause()
        if not self.main:
            ranks.barrier()
            return {"cell": self.cell.id, "rank": ranks.rank()}
        from lorarl.train import flags

        self.recorder.flush()
        if self.collapse_at is not None or (self.ckpt.stop_at is not None and self.divergence.step is not None):
            self.snapshots.fill_after_stop(model, state_dict)  # the planned snapshots it never reached: its final
            # policy (a collapse stop; a divergence before its ``stop_at``, e.g. a rung that must be evaluated)
        policy.save(self.work / "adapter", model, state_dict=state_dict)  # residual inits: on the original base
        if tokenizer is not None and self.cfg.adapter.method == "full":
            tokenizer.save_pretrained(self.work / "adapter")
        shutil.rmtree(self.work / "trainer", ignore_errors=True)
        summary = self._summary(policy, model, facts, extra)
        self.tracker.log_summary({k: summary[k] for k in ("final_train_reward", "wall_time_s", "params_trainable",
                                                          "trainable_fraction")},
                                 tags={**policy.mlflow_tags(), "lorarl.state": self.divergence.state,
                                       **flags.mlflow_tags(summary["flags"])})
        self.tracker.finish()
        c = self.cell
        write_json(self.work / "cell.json", {"id": c.id, "axes": c.axes, "hash": c.hash, "eval_hash": c.eval_hash,
                                             "aliases": list(c.aliases), "config": self.cfg.model_dump(mode="json")})
        self._publish(summary)
        self.ckpt.finish()  # outputs in place: delete the checkpoints (train.keep_checkpoint keeps the last)
        if self.stage is None:
            ranks.barrier()
        return summary

    def _summary(self, policy: Any, model: Any, facts: dict, extra: dict | None) -> dict:
        from lorarl.train import flags
        from lorarl.numerics.precision import trainable_dtypes

        rows = self.recorder.rows
        rewards = [r["reward"] for r in rows if "reward" in r and math.isfinite(r["reward"])]
        tail = rewards[-max(1, len(rewards) // 10):]
        summary = {
            "study": self.study, "cell": self.cell.id, "config_hash": self.cell.hash, "mlflow_run_id": self.run_id,
            **self.divergence.summary(),  # "state": "done" | "diverged" (+ diverged_at_step, diverged_reason)
            "steps": len(rows), "final_train_reward": sum(tail) / len(tail) if tail else float("nan"),
            "first_train_reward": rewards[0] if rewards else float("nan"),
            "wall_time_s": round(time.time() - self.t_start + self.ckpt.elapsed_before, 2),  # all attempts
            "mean_step_time_s": sum(r["step_time_s"] for r in rows) / max(1, len(rows)),
            "startup_s": round(sum(r.get("time/startup_s", 0.0) for r in rows), 3),  # every job's start-up, in no step's time
            **policy.counts(), **self.ckpt.summary(), **facts,
            "precision": self.precision, "trainable_dtypes": trainable_dtypes(model),
            "adapter": policy.fingerprint,  # what was actually built: peft type/config, counts, init checksum
            "flags": flags.detect(rows),  # collapse flag -> first step it fired (lorarl.train.flags)
            **(extra or {}),
        }
        if self.collapse_at is not None:
            summary["stopped_on_collapse"] = self.collapse_at
        return summary

    def _publish(self, summary: dict) -> None:
        from lorarl.io import disk_full_hook

        if self.stage is not None:  # a pack job: staged for the cell's own train job (lorarl.pack.publish)
            write_json(self.work / "summary.json", summary)
            self.stage(self.work, self.final)
            return
        disk_full_hook(self.work / "summary.json")  # test hook LORARL_FAULT=disk_full (lorarl.pipeline.jobs.diskfull)
        write_json(self.work / "summary.json", summary)
        salvage.publish(self.work, self.results_dir, self.study, self.cell.id, self.cell.hash)  # summary.json last

    def pause(self) -> dict:
        """End paused at the stop step: its checkpoint (full state) kept, ``paused.json`` beside it, nothing published,
        the MLflow run ended with ``lorarl.state=paused``, the lock released."""
        from lorarl.train import integrity

        step = self.paused_at
        out = {"study": self.study, "cell": self.cell.id, "state": "paused", "paused_at_step": step,
               "mlflow_run_id": self.run_id}
        if not self.main:
            ranks.barrier()
            return {**out, "rank": ranks.rank()}
        self.recorder.flush()
        if self.resumed is not None:
            integrity.resume_worked(self.resumed.path)  # resumed and paused at once: no crash to count
        self.tracker.set_tags({"lorarl.state": "paused", "lorarl.paused_at_step": str(step)})
        self.tracker.finish()
        write_json(self.ckpt.root / cellstate.PAUSED, {**out, "config_hash": self.cell.hash, "time": time.time(),
                                                       "checkpoint": f"checkpoint-{self.ckpt.paused}"})
        shutil.rmtree(self.work, ignore_errors=True)
        self.ckpt.release()
        print(f"[lorarl] cell {self.cell.id} paused at step {step}; its state is in {self.ckpt.root}", flush=True)
        if self.stage is None:
            ranks.barrier()
        return out


def _tag_provenance(tracker: Any) -> None:
    """Every job id that worked on this run so far (across requeues and reruns), and the host."""
    from lorarl import jobids

    path = os.environ.get(jobids.ENV_PATH)
    if tracker is None or not path:
        return
    ids = jobids.job_ids(path)
    tags = {"lorarl.provenance": path, "lorarl.host": os.uname().nodename}
    if ids:
        tags["lorarl.job_ids"] = ",".join(ids)
    try:
        tracker.set_tags(tags)
    except Exception as err:  # noqa: BLE001 - tags are a convenience; provenance.json is the record
        print(f"[lorarl] could not tag the MLflow run: {err}", file=sys.stderr)
