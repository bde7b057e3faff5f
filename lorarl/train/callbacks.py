"""Per-step metrics → metrics.csv (source of truth) and MLflow (the view), with step wall time."""

from __future__ import annotations

import csv
import time
from pathlib import Path

from transformers import TrainerCallback

from lorarl.tracking.client import Tracker

SKIP = {"epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
        "train_loss"}


class MetricsRecorder(TrainerCallback):
    """Collects TRL's per-step logs, adds `step_time_s`, appends to CSV, batches to MLflow."""

    def __init__(self, csv_path: Path, tracker: Tracker | None, flush_every: int = 10):
        self.csv_path = Path(csv_path)
        self.tracker = tracker
        self.flush_every = flush_every
        # with checkpoints (lorarl.train.checkpoint): MLflow gets a step only once a checkpoint covers it
        self.log_only_saved = False
        self.rows: list[dict[str, float]] = []
        self._pending: list[dict[str, float]] = []
        self._t0 = 0.0
        self._step_time = 0.0

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._step_time = time.perf_counter() - self._t0

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs and not any(k.startswith("reward") for k in logs):
            return
        row = {"step": state.global_step}
        # TRL logs a metric whose every value was NaN as None: kept as NaN (a diverged step stays visible)
        row.update({k: float("nan") if v is None else float(v) for k, v in logs.items()
                    if k not in SKIP and (v is None or isinstance(v, (int, float)))})
        row["step_time_s"] = self._step_time
        self.rows.append(row)
        self._pending.append(row)
        if len(self._pending) >= self.flush_every and not self.log_only_saved:
            self.flush()

    def flush(self) -> None:
        self._write_csv()
        if self.tracker is not None and self._pending:
            self.tracker.log_metrics(self._pending, wait=False)  # store away: train on, send later
        self._pending = []

    def on_save(self, args, state, control, **kw):
        self.flush()

    def on_train_end(self, args, state, control, **kw):
        self.flush()

    def _write_csv(self) -> None:
        cols = ["step"] + sorted({k for r in self.rows for k in r} - {"step"})
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(self.rows)
        tmp.replace(self.csv_path)


class ResumedAtEnd(Exception):
    """Resumed from the last step's checkpoint (a kill while the final outputs were written): nothing
    is left to train, and HF's Trainer, which checks max_steps only after a step, would train one more."""


class NoStepPastTheEnd(TrainerCallback):
    """Stops `trainer.train(resume_from_checkpoint=...)` before a step when the checkpoint is already at
    max_steps (on_train_begin runs once the checkpoint's weights are loaded)."""

    def on_train_begin(self, args, state, control, **kw):
        if state.max_steps and state.global_step >= state.max_steps:
            raise ResumedAtEnd(state.global_step)
