"""Checkpoint, resume and preemption for a training cell (requeue → same MLflow run, same history).

Layout, outside Snakemake's declared outputs (its incomplete-output cleanup never touches it):

    results/<study>/.checkpoints/<cell>/
        checkpoint-<step>/   the engine's state (the HF Trainer's checkpoint: adapter (or model), optimizer,
                             scheduler, RNG states, trainer_state.json; or the pack's cell_state.pt:
                             lorarl.train.cellstate); plus lorarl.json, written LAST (the mark of a
                             complete checkpoint): config hash, MLflow run id, step, metric rows, monitors
        progress.json        step x/N, job, time: updated every step (`lorarl status`)
        complete.json        the cell finished and `keep_checkpoint` kept its last checkpoint
        paused.json          the run ended paused at its last checkpoint (a host's stop_at: lorarl.train.cellrun)
        .lock                one trainer per cell at a time

Invariants that make the metric history continuous and duplicate-free across kills and requeues:
1. The MetricsRecorder sends a step to MLflow's own keys only after a complete checkpoint covers it
   (`log_only_saved`): their high-water mark never passes the latest complete checkpoint. Before that the
   step shows live under `live/<key>` (lorarl.train.callbacks; each (live key, step) once as well).
2. A resumed run reloads the rows of its checkpoint into metrics.csv and re-logs the ones above
   the MLflow run's high-water mark (a kill between lorarl.json and the MLflow flush loses nothing);
   Tracker.log_metrics drops every step at or below that mark (nothing is logged twice).
3. A checkpoint is also saved at the last step, so a job killed while writing the final outputs
   resumes at the end and never recomputes (and never re-logs) a step (lorarl.train.callbacks.ResumedAtEnd).

Preemption (lorarl.train.preemption): under submitit, Slurm's USR2 (sent `signal_delay_s` before the time
limit, or by `scancel --signal=USR2`) is caught during training, for every cell of the process at once (a
pack's members too): the current step finishes, a checkpoint is saved, then submitit's own handler runs
(`checkpoint()` → `scontrol requeue` → exit). The requeued job resumes from that checkpoint. SIGTERM
(scancel, `scontrol requeue`, a preemption with a grace time) also gets a checkpoint at the end of the step
if the step ends before Slurm's SIGKILL. A cell killed outright (SIGKILL, node failure) resumes from its
latest complete checkpoint the next time it runs: the requeued job, or the Snakemake rerun.

Test hooks: LORARL_FAULT="kill_at_step:N" (SIGKILL at the end of step N) or "kill_after_save:N" (SIGKILL
right after the checkpoint at step N is complete, before its metrics reach MLflow), each firing once per
checkpoint folder; "step_delay_ms:N": every step ends N ms later (a job a test can signal while it trains).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from lorarl.train import integrity
from lorarl import paths
from lorarl.faulthooks import FAULT_ENV, number as fault_number
from lorarl.io import read_json as _read_json
from lorarl.io import write_json as _write_json

MARKER = "lorarl.json"
COMPLETE = "complete.json"
PROGRESS = "progress.json"
LOCK_WAIT_ENV = "LORARL_LOCK_WAIT_S"  # how long a second job of a cell waits for the first (default 600 s)
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict

    @property
    def run_id(self) -> str:
        return self.meta["mlflow_run_id"]

    @property
    def rows(self) -> list[dict]:
        return self.meta.get("rows", [])


def complete_checkpoints(root: str | Path) -> list[Checkpoint]:
    """Checkpoints with their lorarl.json mark, oldest first (a folder without it is a partial save)."""
    out = []
    root = Path(root)
    if not root.is_dir():
        return out
    for d in root.iterdir():
        m = _CKPT_RE.match(d.name)
        meta = _read_json(d / MARKER) if m and d.is_dir() else None
        if meta is not None and int(meta.get("step", -1)) == int(m.group(1)):
            out.append(Checkpoint(d, int(m.group(1)), meta))
    return sorted(out, key=lambda c: c.step)


def progress(root: str | Path) -> dict | None:
    return _read_json(Path(root) / PROGRESS)


def _job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")


class CellCheckpoints:
    """The checkpoint folder of one cell, owned by its run (`lorarl.train.cellrun.CellRun`)."""

    def __init__(self, results_dir: str | Path, study: str, cell: Any, *, lock_wait_s: float | None = None,
                 holder: str = "", fmt: str = "hf"):
        """``lock_wait_s``: how long to wait for another job holding the cell (None: $LORARL_LOCK_WAIT_S,
        600 s; 0: fail at once). ``holder``: written into the lock (e.g. the pack). ``fmt``: which trainer
        wrote the checkpoints ("hf": TRL/HF Trainer folders; "pack": lorarl.pack.run), lorarl.train.cellstate's
        engine; a checkpoint of the other engine is rejected."""
        t = cell.config.train
        self.format = fmt
        self.root = Path(paths.pattern("checkpoints", results=str(results_dir), study=study, cell=cell.id))
        self.config_hash = cell.hash
        per = int(getattr(t, "updates_per_step", 1))  # checkpoints at training-step (rollout) boundaries
        self.every = int(getattr(t, "checkpoint_every", 0) or 0) * per
        self.keep = bool(getattr(t, "keep_checkpoint", False))
        self.max_steps = int(t.steps) * per  # TRL's global steps = optimiser updates
        self.enabled = self.every > 0
        self.resumed: Checkpoint | None = None
        self.run_id: str | None = None
        self.recorder: Any = None
        self.preempt_requested: float | None = None
        self.terminate_requested: float | None = None
        self.stopped_for_preemption = False
        self.elapsed_before = 0.0
        self.resumes: list[int] = []
        self.problems: list[str] = []  # checkpoints found unusable (lorarl.train.integrity), for summary.json
        self.stop_at: int | None = None  # a host's stop (lorarl.train.cellrun): save and stop at this global step
        self.paused: int | None = None  # the global step it stopped at for stop_at (the run ends paused)
        self.monitors: Any = None  # () -> the cell run's monitor state, written into each mark (lorarl.train.cellstate)
        self._t0 = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root / ".lock", "a+")
        self.waited_for_lock = False  # another job trained this cell meanwhile: train_cell checks its outputs
        wait = float(os.environ.get(LOCK_WAIT_ENV, "600")) if lock_wait_s is None else float(lock_wait_s)
        t_wait = time.time()  # the wait for the cell's lock: the cost ledger's wait phase
        deadline = t_wait + wait
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                self._lock.seek(0)
                holder = self._lock.read().strip()
                if time.time() >= deadline:
                    raise RuntimeError(f"cell {cell.id} is being trained by another process ({holder or 'unknown'}); "
                                       f"its checkpoints are in {self.root}") from None
                if not self.waited_for_lock:
                    print(f"[lorarl] cell {cell.id} is being trained by another process ({holder or 'unknown'}): "
                          f"waiting for it (at most ${LOCK_WAIT_ENV} s)", file=sys.stderr, flush=True)
                self.waited_for_lock = True
                time.sleep(2.0)
        from lorarl import ledger

        ledger.spent("wait", time.time() - t_wait)
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"pid {os.getpid()} job {_job_id()} host {os.uname().nodename}{' ' + holder if holder else ''}\n")
        self._lock.flush()

    # ---- before training -------------------------------------------------------------------------
    def resume_run(self, tracker: Any) -> str | None:
        """Reopen the MLflow run of the newest sound complete checkpoint of this config; None = start
        fresh (then every stale checkpoint, of an older config or a finished cell, is deleted). A
        checkpoint of another config, with a truncated/missing/altered file, a gone MLflow run or a
        crash loop behind it (lorarl.train.integrity) is reported, deleted, and the previous one tried."""
        latest = None
        if not (self.root / COMPLETE).exists():
            for c in reversed(complete_checkpoints(self.root)):
                why = integrity.problem(c.path, c.meta, self.config_hash)
                if why is None and c.meta.get("format", "hf") != self.format:
                    why = f"written by the {c.meta.get('format', 'hf')} trainer, this one is the {self.format} trainer"
                if why is None and not _run_alive(tracker, c.run_id):
                    why = f"its MLflow run {c.run_id} is gone or deleted"
                if why is None:
                    latest = c
                    break
                self._reject(c.path, why)
            for d in sorted(self.root.glob("checkpoint-*")):
                if d.is_dir() and not (d / MARKER).exists():
                    self._reject(d, f"no {MARKER} mark (a save cut short by a kill)")
        if latest is None:
            self._clear()
            return None
        self.resumed = latest
        integrity.start_resume(latest.path)  # cleared by the first step that completes after loading it
        self.run_id = tracker.resume(latest.run_id)
        self.elapsed_before = float(latest.meta.get("elapsed_s", 0.0))
        self.resumes = list(latest.meta.get("resumes", [])) + [latest.step]
        print(f"[lorarl] resuming from {latest.path} (step {latest.step}/{self.max_steps}) into MLflow run "
              f"{self.run_id} (high-water mark {tracker.high_water})", flush=True)
        return self.run_id

    def restore(self, recorder: Any, run_id: str) -> None:
        """Give the recorder the rows already trained, and send MLflow the ones it missed."""
        self.run_id, self.recorder = run_id, recorder
        if self.enabled and hasattr(recorder, "log_only_saved"):
            recorder.log_only_saved = True
        if self.resumed is None:
            return
        recorder.rows = [dict(r) for r in self.resumed.rows]
        if recorder.tracker is not None and recorder.rows:
            from lorarl.train.callbacks import live_rows

            live = live_rows(recorder.rows) if recorder.log_only_saved else []  # live/ shows every step too
            recorder.tracker.log_metrics(recorder.rows + live)  # steps at or below a key's high-water mark: dropped
        recorder.write_csv()

    def check_trainer_args(self, args: Any) -> None:
        """Checkpoints go to the checkpoint folder (the trainer's ``output_dir``, given to
        lorarl.train.trl_args.grpo_args) and this module decides when (no HF rotation)."""
        if Path(args.output_dir).resolve() != Path(self.root).resolve() or args.save_total_limit is not None:
            raise ValueError(f"trainer output_dir must be the cell's checkpoint folder {self.root} (got "
                             f"{args.output_dir}) with save_total_limit None (got {args.save_total_limit})")

    @property
    def resume_from(self) -> str | None:
        return str(self.resumed.path) if self.resumed else None

    def attach(self, trainer: Any, recorder: Any) -> None:
        """Add the checkpoint callback just before the recorder: lorarl.json exists before MLflow
        sees the steps it covers."""
        self.check_trainer_args(trainer.args)
        cb = _callback(self)
        handler = trainer.callback_handler
        if recorder in handler.callbacks:
            handler.callbacks.insert(handler.callbacks.index(recorder), cb)
        else:
            trainer.add_callback(cb)

    @contextmanager
    def preemption(self) -> Iterator[None]:
        """While a solo job trains this cell: Slurm's USR2 finishes the step, saves, then submitit requeues the job;
        SIGTERM saves and exits (lorarl.train.preemption; a pack catches the signal for all its members at once)."""
        from lorarl.train.preemption import catch

        with catch([self]) as caught:
            yield
        caught.hand_over()

    # ---- after training --------------------------------------------------------------------------
    def wall_time(self) -> float:
        return self.elapsed_before + (time.time() - self._t0)

    def summary(self) -> dict:
        return {"resumed_from_steps": self.resumes, "checkpoint_every": self.every,
                "checkpoint_problems": self.problems}

    def finish(self) -> None:
        """The cell's outputs are in place: remove the checkpoints, or keep the last one (marked done)."""
        ckpts = complete_checkpoints(self.root)
        if self.keep and ckpts:
            for c in ckpts[:-1]:
                shutil.rmtree(c.path, ignore_errors=True)
            _write_json(self.root / COMPLETE, {"step": ckpts[-1].step, "finished_at": time.time(),
                                               "config_hash": self.config_hash, "mlflow_run_id": self.run_id})
        else:
            for d in self.root.iterdir():
                if d.name != ".lock":
                    shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
        self.release(remove_dir=not self.keep)

    def release(self, remove_dir: bool = False) -> None:
        if self._lock.closed:
            return
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
        if remove_dir:
            shutil.rmtree(self.root, ignore_errors=True)
            try:
                self.root.parent.rmdir()  # .checkpoints/ when it is empty
            except OSError:
                pass

    # ---- internals -------------------------------------------------------------------------------
    def _clear(self) -> None:
        for d in self.root.iterdir():
            if d.name != ".lock":
                shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)

    def _reject(self, folder: Path, why: str) -> None:
        msg = f"{folder.name} not used: {why}"
        self.problems.append(msg)
        print(f"[lorarl] checkpoint problem ({self.root}): {msg}; deleting it", file=sys.stderr, flush=True)
        shutil.rmtree(folder, ignore_errors=True)

    def step_end(self, step: int, max_steps: int | None = None, leaving: bool = False) -> tuple[bool, bool]:
        """After optimiser update ``step``: progress.json, then (save, stop) for a pause at ``stop_at`` or a preemption
        (lorarl.train.preemption). ``leaving``: the cell ends at this step anyway (its host stopped or paused it): a
        preemption does not stop it, it ends as it would have."""
        if self.resumed is not None:  # a step completed after loading it: that checkpoint is readable
            integrity.resume_worked(self.resumed.path)
        _write_json(self.root / PROGRESS, {"step": step, "max_steps": int(max_steps or self.max_steps),
                                           "job_id": _job_id(), "pid": os.getpid(), "time": time.time(),
                                           "config_hash": self.config_hash})
        save = stop = self.stop_at is not None and self.stop_at <= step < self.max_steps and self.paused is None
        if save:  # a pause: saved even without checkpoint_every
            self.paused = step
        if (self.preempt_requested or self.terminate_requested) and step < self.max_steps and not (save or leaving):
            save = stop = self.stopped_for_preemption = True  # saved even without checkpoint_every (a pack's member)
        if not self.enabled:
            return save, stop
        if step % self.every == 0 or step >= self.max_steps:
            save = True
        _fault("kill_at_step", step, self.root)
        time.sleep((fault_number("step_delay_ms") or 0) / 1000)  # test hook: a step long enough to be signalled
        return save, stop

    def mark(self, step: int) -> None:
        """The engine's files of ``checkpoint-<step>`` are written: its mark (lorarl.json) makes it complete."""
        folder = self.root / f"checkpoint-{step}"
        if not folder.is_dir():
            return
        rows = [r for r in (self.recorder.rows if self.recorder is not None else [])
                if int(r.get("update", r["step"])) <= step]
        meta = {"step": step, "max_steps": self.max_steps, "config_hash": self.config_hash, "format": self.format,
                "mlflow_run_id": self.run_id, "rows": rows,
                "elapsed_s": self.wall_time(), "resumes": self.resumes, "job_id": _job_id(),
                "saved_at": time.time(), "files": integrity.manifest(folder),  # sizes + sha256 (lorarl.train.integrity)
                "monitors": self.monitors() if self.monitors is not None else {}}  # lorarl.train.cellstate
        _write_json(folder / MARKER, meta)
        for c in complete_checkpoints(self.root):  # keep only the newest complete checkpoint
            if c.step != step:
                shutil.rmtree(c.path, ignore_errors=True)
        for d in self.root.glob("checkpoint-*"):  # partial saves left by a kill
            if d.is_dir() and not (d / MARKER).exists() and d != folder:
                shutil.rmtree(d, ignore_errors=True)
        _fault("kill_after_save", step, self.root)


def _run_alive(tracker: Any, run_id: str) -> bool:
    try:
        run = tracker.client.get_run(run_id)
    except Exception:  # noqa: BLE001 - a missing run is "not alive"
        return False
    return run.info.lifecycle_stage == "active"


def _fault(kind: str, step: int, root: Path) -> None:
    if fault_number(kind) != step:
        return
    fired = root / f".fault-{kind}-{step}"
    if fired.exists():
        return
    fired.write_text(str(os.getpid()))
    print(f"[lorarl] {FAULT_ENV}={kind}:{step}: SIGKILL to myself", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _callback(owner: CellCheckpoints) -> Any:
    """The TrainerCallback (built here so that importing this module stays free of transformers)."""
    from transformers import TrainerCallback

    class CheckpointCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            save, stop = owner.step_end(int(state.global_step), state.max_steps)
            control.should_save = control.should_save or save
            control.should_training_stop = control.should_training_stop or stop

        def on_save(self, args, state, control, **kw):
            owner.mark(int(state.global_step))

    return CheckpointCallback()
