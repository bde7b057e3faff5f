"""Per-step metrics → metrics.csv (source of truth) and MLflow (the view), with step wall time.

MLflow sees each step as it is recorded (batched: at most one live batch per ``LIVE_EVERY_S``, so a store
write never costs a fast step much; a longer step is sent at its end): under its own key when no later attempt
can train that step again (no checkpoints: a killed cell starts over in a new run), else under ``live/<key>``,
and under its own key once a complete checkpoint covers it, exactly once across kills (``log_only_saved``,
lorarl.train.checkpoint). A checkpoint sends what is still unsent live first, and a resumed run re-sends its
checkpoint's rows live too, so ``live/`` ends with every step once; a step a killed attempt showed live and the
next attempt trains again keeps the killed attempt's live value there, its own key the retrained one.

A step is a training step (one rollout batch, ``train.steps``' unit); with PPO mini-batches or several
epochs it holds ``updates_per_step`` optimiser updates (TRL's global steps): a row's ``step`` is the
training step, ``update`` the optimiser update it ends at, and ``step_time_s`` the step's wall time."""

from __future__ import annotations

import csv
import time
from pathlib import Path

from transformers import TrainerCallback

from lorarl.jobclock import first_work
from lorarl.tracking.client import Tracker

LIVE_EVERY_S = 2.0  # the shortest time between two live MLflow batches of a cell (docs/tracking.md#live-metrics)
LIVE = "live/"  # the prefix of a value logged before a checkpoint covers its step
SKIP = {"epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
        "train_loss"}


class MetricsRecorder(TrainerCallback):
    """Collects TRL's per-step logs, adds `step_time_s`, appends to CSV, batches to MLflow."""

    def __init__(self, csv_path: Path, tracker: Tracker | None, flush_every: int = 10, updates_per_step: int = 1,
                 write: bool = True, live_every_s: float = LIVE_EVERY_S):
        self.csv_path = Path(csv_path)
        self.write = write  # False on ranks other than 0: rows kept (the monitors read them), nothing written
        self.updates_per_step = int(updates_per_step)  # optimiser updates per training step (TrainConfig)
        self.tracker = tracker
        self.flush_every = flush_every
        self.live_every_s = live_every_s  # shortest time between two live batches (0: every step at once)
        self._live_at = float("-inf")  # when the last live batch went (time.monotonic)
        # with checkpoints (lorarl.train.checkpoint): MLflow gets a step only once a checkpoint covers it
        self.log_only_saved = False
        self.rows: list[dict[str, float]] = []
        self._pending: list[dict[str, float]] = []
        self._unsent: list[dict[str, float]] = []  # rows not yet sent live
        self._t0 = 0.0
        self._time, self._updates = 0.0, 0  # wall time and optimiser updates since the last logged row
        self.startup_s: float | None = None  # this job's start-up (lorarl.jobclock), for its first row

    def on_step_begin(self, args, state, control, **kw):
        first_work("training step")  # the job's start-up ends here (lorarl.jobclock)
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._time += time.perf_counter() - self._t0
        self._updates += 1

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs and not any(k.startswith("reward") for k in logs):
            return
        u = self.updates_per_step
        row = {"step": -(-int(state.global_step) // u), **({"update": state.global_step} if u > 1 else {})}
        # TRL logs a metric whose every value was NaN as None: kept as NaN (a diverged step stays visible)
        row.update({k: float("nan") if v is None else float(v) for k, v in logs.items()
                    if k not in SKIP and (v is None or isinstance(v, (int, float)))})
        row["step_time_s"] = self._time / max(self._updates, 1) * u  # mean over the window, per training step
        self._time, self._updates = 0.0, 0
        self.record(row)

    def record(self, row: dict[str, float]) -> None:
        """One step's row: the job's start-up stamped on its first, kept, sent live, and written (metrics.csv,
        MLflow's own keys) at the next flush."""
        self.stamp_startup(row)
        self.rows.append(row)
        self._pending.append(row)
        self._unsent.append(row)
        if time.monotonic() - self._live_at >= self.live_every_s:
            self.send_live()
        if len(self._pending) >= self.flush_every and not self.log_only_saved:
            self.flush()

    def stamp_startup(self, row: dict) -> None:
        """The job's first row of this cell carries the job's start-up seconds (``time/startup_s``); later rows none."""
        if self.startup_s is not None:
            row["time/startup_s"], self.startup_s = self.startup_s, None

    def send_live(self) -> None:
        """The rows recorded since the last live batch, to MLflow now (a store away: pending, training goes on)."""
        rows, self._unsent = self._unsent, []
        if not self.write or self.tracker is None or not rows:
            return
        # with checkpoints, their own keys wait for the checkpoint that covers them
        self.tracker.log_metrics(live_rows(rows) if self.log_only_saved else rows, wait=False)
        self._live_at = time.monotonic()

    def flush(self) -> None:
        if not self.write:
            self._pending = []
            return
        if self.log_only_saved:
            self.send_live()  # live/ keeps every step, ahead of (or with) its own key
        self.write_csv()
        if self.tracker is not None and self._pending:
            self.tracker.log_metrics(self._pending, wait=False)  # store away: train on, send later (steps already
            # sent live under their own keys are dropped: no checkpoints)
        self._pending = []

    def on_save(self, args, state, control, **kw):
        self.flush()

    def on_train_end(self, args, state, control, **kw):
        self.flush()

    def write_csv(self) -> None:
        if not self.write:
            return
        cols = ["step"] + sorted({k for r in self.rows for k in r} - {"step"})
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(self.rows)
        tmp.replace(self.csv_path)


def live_rows(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The rows with every metric under its ``live/`` key."""
    return [{"step": r["step"], **{LIVE + k: v for k, v in r.items() if k != "step"}} for r in rows]


class ResumedAtEnd(Exception):
    """Resumed from the last step's checkpoint (a kill while the final outputs were written): nothing
    is left to train, and HF's Trainer, which checks max_steps only after a step, would train one more."""


class NoStepPastTheEnd(TrainerCallback):
    """Stops `trainer.train(resume_from_checkpoint=...)` before a step when the checkpoint is already at
    max_steps (on_train_begin runs once the checkpoint's weights are loaded)."""

    def on_train_begin(self, args, state, control, **kw):
        if state.max_steps and state.global_step >= state.max_steps:
            raise ResumedAtEnd(state.global_step)
