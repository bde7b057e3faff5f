"""One cell's run, whatever hosts it: written once, used by the solo job, the pack and the resident pack.

The door (every host calls these and reads nothing else of the run but ``done``):

    run = CellRun(study, cell, results_dir, cfg)             # the cell's lock, its checkpoint folder
    if run.done: return run.done                             # its outputs in place: another job finished it
    resume = run.open(precision, save=..., tokenizer=...)    # MLflow run, rows, snapshots: a Resume record
    run.ready()                                              # before the host's first step (start-up time)
    per step: run.step_done(step, row, model)                # -> "running" | "diverged" | "stopped" | "paused"
              run.end_step(step, write_state, pause=...)     # progress, a checkpoint when due; True: host stops
    return run.close(policy, model, facts=...)               # adapter, summary, MLflow, cell.json, publish
                                                             # (or, stopped at ``stop_at``: paused)
    on an exception: run.fail(err)

A step-loop host (lorarl.pack.run) calls these itself; HF's Trainer (the solo job) through one adapter of
TrainerCallbacks (:mod:`lorarl.train.hf_host`), which also hands the run's parts (recorder, snapshots, collapse
and divergence monitors, checkpoints) to the trainer. ``Resume`` is what the host needs of the checkpoint: the
engine state's folder, the step, the host's monitors, and whether the cell takes steps at all.

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
per admitted cell (its engine state loaded from ``resume.path``) and evicts one between steps with
``run.end_step(step, write_state, pause=True)`` then ``run.close(...)`` (paused) or lets it finish; no run refers
to another.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from lorarl import paths
from lorarl.io import write_json
from lorarl.train import cellstate, ranks, salvage


class WrongHost(RuntimeError):
    """A host whose engine cannot resume the cell's state (lorarl.train.cellstate): refused, never switched."""


@dataclass(frozen=True)
class Resume:
    """Where a cell's run starts, for its host: a plain record of the checkpoint it resumed (or of a fresh start)."""

    path: str | None  # the checkpoint folder whose engine state the host loads (None: a fresh start), every rank's
    step: int  # the training step the checkpoint ends (0: fresh), every rank's
    monitors: dict  # the host's monitors saved with it (adv_std_peak, tokens_seen, the vLLM freshness window)
    state: str  # "running"; "diverged"/"stopped" (finished at that checkpoint: it takes no step); "paused" (at its stop_at)
    diverged_at: int | None  # the step it diverged at (None: it did not)


class CellRun:
    """One cell's run: lock + checkpoints, MLflow run, recorder, monitors, snapshots, summary, cell.json, publish.

    Public: the door (``done``, :meth:`open`, :meth:`ready`, :meth:`step_done`, :meth:`end_step`, :meth:`close`,
    :meth:`fail`, :meth:`preemption`, ``host_state``) and the parts the HF adapter hands to the Trainer
    (``checkpoints``, ``recorder``, ``snapshots``, ``divergence``, ``collapse_monitor``: lorarl.train.hf_host)."""

    def __init__(self, study: str, cell: Any, results_dir: str | Path, cfg: Any, *, engine: str = "hf",
                 main: bool = True, stage: Callable[[Path, Path], Any] | None = None, holder: str = "",
                 lock_wait_s: float | None = None, stop_at: int | None = None, t_start: float | None = None,
                 invocation: str | None = None):
        """``cfg``: the config the run trains with (written into cell.json). ``engine``: whose state its checkpoints
        hold ("hf": the solo trainer, "pack": the step loop). ``stage``: publish by handing the work folder to it
        (the pack's staging), else in place. ``holder``/``lock_wait_s``: the lock (lorarl.train.checkpoint).
        ``stop_at``: end paused at this training step (None: train to ``train.steps``). ``invocation``: the Snakemake
        run of the job (its kept outputs, lorarl.train.salvage, are put back only for that run's reasons)."""
        from lorarl.language.evalplan.plan import snapshot_steps
        from lorarl.train.checkpoint import CellCheckpoints
        from lorarl.numerics.divergence import Divergence
        from lorarl.train.rank_checkpoints import FollowerCheckpoints

        self._study, self._cell, self._results_dir, self._cfg, self._main = study, cell, results_dir, cfg, main
        self._invocation = invocation
        self._t_start = time.time() if t_start is None else t_start
        self._per = int(cfg.train.updates_per_step)  # optimiser updates per training step (HF's global steps)
        self._final = paths.cell_dir(results_dir, study, cell.id)
        self._stage = stage
        self._work = self._final / (".pack.tmp" if stage is not None else ".train.tmp")
        self.checkpoints = (CellCheckpoints(results_dir, study, cell, lock_wait_s=lock_wait_s, holder=holder, fmt=engine)
                            if main else FollowerCheckpoints(results_dir, study, cell))
        ckpt = self.checkpoints
        ckpt.stop_at = None if stop_at is None else int(stop_at) * self._per
        ckpt.monitors = self._monitor_state
        if not main:  # a follower rank learns rank 0's pause (lorarl.train.rank_checkpoints)
            ckpt.paused, ckpt.max_steps = None, int(cfg.train.steps) * self._per
        self._snapshot_steps = sorted(snapshot_steps(cfg))  # the steps whose adapter is kept (eval.eval_every)
        self.divergence = Divergence(self._per)  # NaN/inf loss, reward or gradient: stop, state "diverged"
        self._collapse_at: int | None = None  # train.stop_on_collapse: the step a collapse flag stopped the cell
        self.host_state: Callable[[], dict] = dict  # the host's monitors (adv_std_peak, freshness) for a checkpoint
        self._tracker = self._run_id = self._precision = None
        self.recorder: Any = None  # lorarl.train.callbacks.MetricsRecorder (metrics.csv + MLflow), from open()
        self.snapshots: Any = None  # lorarl.train.snapshots.SnapshotSaver, from open()
        self.collapse_monitor: Any = None  # the HF host's collapse callback (lorarl.train.flags.monitor)
        self.done = ranks.broadcast(self._finished_meanwhile() if main else None)
        other = cellstate.waiting_engine(results_dir, study, cell) if main and self.done is None else None
        other = ranks.broadcast(other if other != engine else None)  # confirmed under the lock (lorarl.pack.hosting)
        if other is not None:  # refused before anything runs: another engine's state is never trained over
            self.checkpoints.release()
            raise WrongHost(f"cell {cell.id}: its checkpoint holds the {other} engine's state, this trainer is the "
                            f"{engine} engine; nothing trained. Run its own train job (lorarl.pack.hosting.solo_host)")
        if main and self.done is None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work.mkdir(parents=True)

    # ---- opening ------------------------------------------------------------------------------------
    def _finished_meanwhile(self) -> dict | None:
        """The summary of a cell whose outputs of this config are in place by the time this job holds its lock (the
        job it waited for finished it, or a lost launcher's job that started late finds a rerun finished it), or were
        kept aside from a killed run's finished job (lorarl.train.salvage): nothing to train. Otherwise never the
        case for a job Snakemake runs on its own outputs: it removes them before the job starts."""
        try:
            summary = json.loads((self._final / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None
        how = "by the job this one waited for" if self.checkpoints.waited_for_lock else "already, by another job"
        if not isinstance(summary, dict) or summary.get("config_hash") != self._cell.hash:
            # a job of a killed Snakemake finished it and the rerun removed its outputs (lorarl.train.salvage)
            summary = salvage.restore(self._results_dir, self._study, self._cell.id, self._cell.hash, self._invocation)
            how = "by a job of a killed Snakemake run (the outputs Snakemake removed are back in place)"
        if summary is None:
            return None
        print(f"[lorarl] cell {self._cell.id} was trained {how} (its outputs of this config are in place); nothing to "
              f"do", flush=True)
        self.checkpoints.release()
        return summary

    def open(self, precision: str, *, save: Callable[..., Any], tokenizer: Any, params: dict | None = None,
             tags: dict | None = None) -> Resume:
        """The cell's MLflow run (the checkpoint's, reopened, or a new one) and its recorder with the rows trained
        before a resume (MLflow gets any it missed); the monitors as the checkpoint left them; snapshots (``save``:
        the adapter's, at the cell's ``eval.eval_every`` steps) and the collapse monitor. Returns where the host starts."""
        from lorarl.tracking.client import Tracker
        from lorarl.train import flags
        from lorarl.train.callbacks import MetricsRecorder
        from lorarl.train.snapshots import SnapshotSaver

        c, run_id, self._precision, ckpt = self._cell, None, precision, self.checkpoints
        if self._main:
            self._tracker = Tracker(self._results_dir, self._study)
            run_id = ckpt.resume_run(self._tracker) or self._tracker.start(  # a requeued/killed cell reopens its run
                c.id, run_name=c.id,
                tags={"lorarl.config_hash": c.hash, **(tags or {}), **{f"axis.{k}": v for k, v in c.axes.items()}},
                params={**c.flat_config(), "train.precision_resolved": precision, **(params or {})})
            (ckpt.root / cellstate.PAUSED).unlink(missing_ok=True)  # a paused run goes on
        self._run_id, resume_from = ranks.broadcast((run_id, ckpt.resume_from))  # every rank: rank 0's choice
        if not self._main:
            ckpt.resume_from = resume_from
        self.recorder = MetricsRecorder(self._work / "metrics.csv", self._tracker, updates_per_step=self._per,
                                        write=self._main)
        ckpt.restore(self.recorder, self._run_id)
        _tag_provenance(self._tracker)
        resumed = getattr(ckpt, "resumed", None)  # lorarl.train.checkpoint.Checkpoint, rank 0 only
        monitors = ranks.broadcast(resumed.meta.get("monitors", {}) if resumed else {})
        self._collapse_at = cellstate.apply_monitors(monitors, self.divergence)
        self.snapshots = SnapshotSaver(self._final / "snapshots", self._snapshot_steps, save, tokenizer,
                                       updates_per_step=self._per)
        self.collapse_monitor = flags.monitor(self.recorder, self._cfg.train.stop_on_collapse, self._per)
        step = ranks.broadcast(int(resumed.step) // self._per if resumed is not None else 0)  # checkpoints: step ends
        state = "diverged" if self.divergence.step is not None else "stopped" if self._collapse_at is not None \
            else "paused" if self._paused_before(step) else "running"
        return Resume(path=resume_from, step=step, monitors=monitors, state=state, diverged_at=self.divergence.step)

    def ready(self) -> None:
        """Before this job's first step: wait for the grading workers the job started beside its model load
        (lorarl.grading.pool.wait_started); the job's start-up seconds so far (that wait, an engine's start:
        lorarl.jobclock) go on this job's first row as ``time/startup_s``, never into a step's time."""
        from lorarl import jobclock
        from lorarl.grading.pool import wait_started

        wait_started()
        self.recorder.startup_s = round(sum(jobclock.startup_s().values()), 3)

    @contextmanager
    def preemption(self) -> Iterator[None]:
        """While a solo host trains: Slurm's USR2 / SIGTERM ends the step, checkpoints and requeues (or exits)
        (lorarl.train.preemption). A host of several runs (a pack) catches the signal for all their checkpoints."""
        with self.checkpoints.preemption():
            yield

    @property
    def preempted(self) -> bool:
        """It stopped for a preemption (its checkpoint holds it): left open by its host, resumed by the requeued job."""
        return bool(self.checkpoints.stopped_for_preemption)

    # ---- after each step ----------------------------------------------------------------------------
    def step_done(self, step: int, row: dict, model: Any, update_refused: bool = False) -> str:
        """One training step's metrics row: recorded (metrics.csv, MLflow: live, then its own key), the
        monitors updated, the snapshot saved. Returns what the cell does next: "running", "diverged" (a
        non-finite metric, or ``update_refused``: its update was not applied), "stopped" (a collapse flag with
        ``train.stop_on_collapse``) or "paused" (``stop_at``)."""
        from lorarl.train import flags

        rec, ckpt = self.recorder, self.checkpoints
        full = {"step": step, **{k: float(v) for k, v in row.items()}, "step_time_s": float(row.get("time/step_s", 0.0))}
        rec.record(full)  # start-up stamped on its first row; metrics.csv, MLflow (live now, its own key at a checkpoint)
        state = "running"
        if update_refused:
            self.divergence.mark(step, "non-finite loss or gradient (update skipped)")
            state = "diverged"
        elif self.divergence.check_row(row, step):
            state = "diverged"  # a NaN reward/metric: this cell stops (in a pack the others go on)
        if state == "running" and self._cfg.train.stop_on_collapse and flags.detect(rec.rows):
            state, self._collapse_at = "stopped", step
        if step in self.snapshots.steps:
            self.snapshots.save_step(step, model)
        if state == "running" and ckpt.stop_at is not None and ckpt.stop_at <= step * self._per < ckpt.max_steps:
            state = "paused"
        return state

    def end_step(self, step: int, write_state: Callable[[Path], None], *, pause: bool = False,
                 force: bool = False) -> bool:
        """After a step: progress, and a checkpoint when due (``train.checkpoint_every``, the last step, a pause,
        a preemption, or ``force``: the cell stopped). ``pause``: end paused at this step (a host evicting the
        cell between steps: a resident pack freeing a place). ``write_state(folder)`` writes the engine's files;
        the mark (lorarl.json) comes last. True when the cell stopped for a preemption (saved, even without
        ``train.checkpoint_every``): its host stops after this step."""
        ckpt, update = self.checkpoints, step * self._per
        leaving = pause or force  # it ends at this step anyway: a preemption leaves it to end as it would have
        if pause:
            ckpt.stop_at, force = update, True
        save, _ = ckpt.step_end(update, ckpt.max_steps, leaving=leaving)
        if (ckpt.enabled or ckpt.paused is not None or ckpt.stopped_for_preemption) and (save or force):
            write_state(ckpt.root / f"checkpoint-{update}")
            ckpt.mark(update)  # lorarl.json (rows, manifest, monitors) LAST: the mark of a complete checkpoint
            self.recorder.flush()  # MLflow sees the steps only once a checkpoint covers them
        return bool(ckpt.stopped_for_preemption)

    def _paused_before(self, step: int) -> bool:
        """A cell resumed at training step ``step``, already at (or past) its ``stop_at``: it pauses without a step."""
        ckpt = self.checkpoints
        stop, at = ckpt.stop_at, int(step) * self._per
        if stop is not None and stop <= at < ckpt.max_steps and ckpt.paused is None:
            ckpt.paused = at
        return ckpt.paused is not None

    # ---- the end ------------------------------------------------------------------------------------
    def _paused_at(self) -> int | None:
        """The training step the run stopped at for ``stop_at`` (None: it trained on, or stopped for another reason:
        a cell that diverged or collapsed at that step is finished, not paused)."""
        if self.checkpoints.paused is None or self.divergence.step is not None or self._collapse_at is not None:
            return None
        return -(-int(self.checkpoints.paused) // self._per)

    def _collapse_step(self) -> int | None:
        """The collapse stop: the HF host's monitor callback's, else the step loop's (or the resumed checkpoint's)."""
        hf = getattr(self.collapse_monitor, "stopped_at", None)
        return hf if hf is not None else self._collapse_at

    def _monitor_state(self) -> dict:
        return cellstate.monitor_state(self.divergence, self._collapse_step(), self.host_state())

    def fail(self, err: BaseException) -> None:
        """The host failed (or was stopped): the MLflow run ends KILLED or FAILED, the lock goes."""
        if self._tracker is not None and self._run_id is not None:  # ended before the lock goes: never taken for dead
            stopped = isinstance(err, (SystemExit, KeyboardInterrupt))  # a preemption, a requeue, a cancel
            self._tracker.finish("KILLED" if stopped else "FAILED", state="preempted" if stopped else "failed")
        self.checkpoints.release()

    def close(self, policy: Any, model: Any, *, facts: dict, state_dict: dict | None = None, tokenizer: Any = None,
              extra: dict | None = None, ended_at: float | None = None) -> dict:
        """The cell's outputs: adapter (the policy's own save), summary.json, the MLflow summary, cell.json, all
        published at once (summary.json last); then its checkpoints go. A run stopped at ``stop_at`` pauses instead.
        ``ended_at``: when its last step in this job ended (a pack member that left before the pack ended): its
        ``wall_time_s`` ends there, as a solo job's does. Ranks other than 0 write nothing and return
        ``{"cell", "rank"}``."""
        self.checkpoints.paused = ranks.broadcast(self.checkpoints.paused)  # rank 0's checkpoint decided (HF host)
        self.recorder.flush()
        self._collapse_at = self._collapse_step()
        if ended_at is not None:  # the same wall_time_s as a solo job's and any host's: up to its own last step
            extra = {**(extra or {}),
                     "wall_time_s": round(ended_at - self._t_start + self.checkpoints.elapsed_before, 2)}
        if self._paused_at() is not None:
            return self._pause()
        if not self._main:
            ranks.barrier()
            return {"cell": self._cell.id, "rank": ranks.rank()}
        from lorarl.train import flags

        self.recorder.flush()
        if self._collapse_at is not None or (self.checkpoints.stop_at is not None and self.divergence.step is not None):
            self.snapshots.fill_after_stop(model, state_dict)  # the planned snapshots it never reached: its final
            # policy (a collapse stop; a divergence before its ``stop_at``, e.g. a rung that must be evaluated)
        policy.save(self._work / "adapter", model, state_dict=state_dict)  # residual inits: on the original base
        if tokenizer is not None and self._cfg.adapter.method == "full":
            tokenizer.save_pretrained(self._work / "adapter")
        shutil.rmtree(self._work / "trainer", ignore_errors=True)
        summary = self._summary(policy, model, facts, extra)
        self._publish(summary, tags={**policy.mlflow_tags(), "lorarl.state": self.divergence.state,
                                     **flags.mlflow_tags(summary["flags"])})
        self.checkpoints.finish()  # outputs in place: delete the checkpoints (train.keep_checkpoint keeps the last)
        if self._stage is None:
            ranks.barrier()
        return summary

    def _summary(self, policy: Any, model: Any, facts: dict, extra: dict | None) -> dict:
        from lorarl.train import flags
        from lorarl.numerics.precision import trainable_dtypes

        rows = self.recorder.rows
        rewards = [r["reward"] for r in rows if "reward" in r and math.isfinite(r["reward"])]
        tail = rewards[-max(1, len(rewards) // 10):]
        summary = {
            "study": self._study, "cell": self._cell.id, "config_hash": self._cell.hash, "mlflow_run_id": self._run_id,
            **self.divergence.summary(),  # "state": "done" | "diverged" (+ diverged_at_step, diverged_reason)
            "steps": len(rows), "final_train_reward": sum(tail) / len(tail) if tail else float("nan"),
            "first_train_reward": rewards[0] if rewards else float("nan"),
            "wall_time_s": round(time.time() - self._t_start + self.checkpoints.elapsed_before, 2),  # all attempts
            "mean_step_time_s": sum(r["step_time_s"] for r in rows) / max(1, len(rows)),
            "startup_s": round(sum(r.get("time/startup_s", 0.0) for r in rows), 3),  # every job's start-up, in no step's time
            **policy.counts(), **self.checkpoints.summary(), **facts,
            "precision": self._precision, "trainable_dtypes": trainable_dtypes(model),
            "adapter": policy.fingerprint,  # what was actually built: peft type/config, counts, init checksum
            "flags": flags.detect(rows),  # collapse flag -> first step it fired (lorarl.train.flags)
            **(extra or {}),
        }
        if self._collapse_at is not None:
            summary["stopped_on_collapse"] = self._collapse_at
        return summary

    def _publish(self, summary: dict, tags: dict) -> None:
        """The MLflow summary (``tags``), cell.json, then summary.json: in place last, or staged (a pack job)."""
        from lorarl.io import disk_full_hook

        self._tracker.log_summary({k: summary[k] for k in ("final_train_reward", "wall_time_s", "params_trainable",
                                                           "trainable_fraction")}, tags=tags)
        self._tracker.finish()
        c = self._cell
        write_json(self._work / "cell.json", {"id": c.id, "axes": c.axes, "hash": c.hash, "eval_hash": c.eval_hash,
                                              "aliases": list(c.aliases), "config": self._cfg.model_dump(mode="json")})
        if self._stage is not None:  # a pack job: staged for the cell's own train job (lorarl.pack.publish)
            write_json(self._work / "summary.json", summary)
            self._stage(self._work, self._final)
            return
        disk_full_hook(self._work / "summary.json")  # test hook LORARL_FAULT=disk_full (lorarl.pipeline.jobs.diskfull)
        write_json(self._work / "summary.json", summary)
        salvage.publish(self._work, self._results_dir, self._study, self._cell.id, self._cell.hash)  # summary.json last

    def _pause(self) -> dict:
        """End paused at the stop step: its checkpoint (full state) kept, ``paused.json`` beside it, nothing published,
        the MLflow run ended with ``lorarl.state=paused``, the lock released."""
        from lorarl.train import integrity

        ckpt, step = self.checkpoints, self._paused_at()
        out = {"study": self._study, "cell": self._cell.id, "state": "paused", "paused_at_step": step,
               "mlflow_run_id": self._run_id}
        if not self._main:
            ranks.barrier()
            return {**out, "rank": ranks.rank()}
        self.recorder.flush()
        resumed = getattr(ckpt, "resumed", None)
        if resumed is not None:
            integrity.resume_worked(resumed.path)  # resumed and paused at once: no crash to count
        self._tracker.set_tags({"lorarl.state": "paused", "lorarl.paused_at_step": str(step)})
        self._tracker.finish()
        write_json(ckpt.root / cellstate.PAUSED, {**out, "config_hash": self._cell.hash, "time": time.time(),
                                                  "checkpoint": f"checkpoint-{ckpt.paused}"})
        shutil.rmtree(self._work, ignore_errors=True)
        ckpt.release()
        print(f"[lorarl] cell {self._cell.id} paused at step {step}; its state is in {ckpt.root}", flush=True)
        if self._stage is None:
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
