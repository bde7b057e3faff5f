"""Early collapse flags from a cell's per-step metrics (the rows of metrics.csv).

Three flags, each the first step at which its rule fires (paper 001 §5.3: process's advantage std
spiked to ≈9 against ≈1 in the stable regimes, completions saturated the token cap, and pass@1 climbed
then fell to 0, ~50 steps after the spike):

* ``adv_std_spike``: ``adv/std`` exceeds both ``SPIKE_RATIO`` × the median of its own earlier values
  (at least ``MIN_HISTORY`` of them) and the absolute floor ``SPIKE_FLOOR`` (group-normalised
  advantages have std ≈ 1, so a stable run never reaches it).
* ``truncation_saturation``: ``frac_truncated`` ≥ ``TRUNC_LEVEL`` for ``TRUNC_RUN`` consecutive logged
  steps (the flag's step is the first of them).
* ``reward_collapse``: the rolling mean (``WINDOW`` steps) of ``accuracy`` (what the paper's collapse
  is about; ``reward`` when accuracy is not logged) first climbed above its start, then fell back
  below the midpoint between start and peak; both the climb and the fall must be at least
  ``MIN_RISE`` and at least ``NOISE_Z`` sds of a difference of two rolling means (robust per-step sd
  from successive differences, x sqrt(2 / WINDOW)), so batch-to-batch noise of a small batch is not a collapse.

The same function runs online (`CollapseMonitor`, optionally stopping training with
``train.stop_on_collapse``) and offline on metrics.csv, so the flags in summary.json are reproducible
from the file. Pure python, no torch.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

SPIKE_RATIO = 3.0  # x the running median of adv/std
SPIKE_FLOOR = 2.5  # absolute adv/std floor (stable regimes stay ≈ 1; paper 001's process peaked ≈ 9)
MIN_HISTORY = 5  # earlier steps needed before a spike can be judged
TRUNC_LEVEL = 0.9  # fraction of completions that hit the token cap
TRUNC_RUN = 3  # consecutive logged steps at or above TRUNC_LEVEL
WINDOW = 5  # rolling mean window of the reward collapse rule
MIN_RISE = 0.1  # the reward must first have climbed this much (absolute) above its start
NOISE_Z = 5.0  # ... and by this many sds of a difference of two rolling means (and fallen as much)
FLAGS = ("adv_std_spike", "truncation_saturation", "reward_collapse")


def _series(rows: Iterable[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for r in rows:
        v = r.get(key)
        if v is None or v != v:  # missing or NaN
            continue
        out.append((int(r["step"]), float(v)))
    return out


def adv_std_spike(rows) -> int | None:
    s = _series(rows, "adv/std")
    for i in range(MIN_HISTORY, len(s)):
        med = statistics.median(v for _, v in s[:i])
        if s[i][1] >= SPIKE_FLOOR and s[i][1] >= SPIKE_RATIO * med:
            return s[i][0]
    return None


def truncation_saturation(rows) -> int | None:
    s = _series(rows, "frac_truncated")
    run = 0
    for i, (_, v) in enumerate(s):
        run = run + 1 if v >= TRUNC_LEVEL else 0
        if run >= TRUNC_RUN:
            return s[i - TRUNC_RUN + 1][0]
    return None


def reward_collapse(rows) -> int | None:
    s = _series(rows, "accuracy") or _series(rows, "reward")
    if len(s) < 2 * WINDOW:
        return None
    vals = [v for _, v in s]
    roll = [sum(vals[max(0, i - WINDOW + 1): i + 1]) / len(vals[max(0, i - WINDOW + 1): i + 1])
            for i in range(len(vals))]
    start = roll[WINDOW - 1]
    peak = start
    for i in range(WINDOW - 1, len(roll)):
        peak = max(peak, roll[i])
        diffs = [abs(b - a) for a, b in zip(vals[: i], vals[1: i + 1])]
        noise = statistics.median(diffs) / 0.6745 / 2 ** 0.5 / WINDOW ** 0.5  # sd of the rolling mean
        need = max(MIN_RISE, NOISE_Z * 2 ** 0.5 * noise)  # sd of a difference of two rolling means
        if peak - start >= need and peak - roll[i] >= need and roll[i] < (start + peak) / 2:
            return s[i][0]
    return None


RULES = {"adv_std_spike": adv_std_spike, "truncation_saturation": truncation_saturation,
         "reward_collapse": reward_collapse}


def detect(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """{flag name: first step it fires} over metric rows ({"step": s, metric: value, ...})."""
    rows = list(rows)
    out = {}
    for name, rule in RULES.items():
        step = rule(rows)
        if step is not None:
            out[name] = step
    return out


def mlflow_tags(flags: Mapping[str, int]) -> dict[str, str]:
    return {f"flag.{k}": str(v) for k, v in flags.items()} | {"lorarl.train.flags": ",".join(sorted(flags)) or "none"}


def monitor(recorder: Any, stop: bool, updates_per_step: int = 1) -> Any:
    """A TrainerCallback reading the MetricsRecorder's rows after each log: records the flags and,
    with ``stop``, ends training at the first one (``stopped_at``, a training step: TRL's global step
    counts optimiser updates, ``updates_per_step`` of them per step)."""
    from transformers import TrainerCallback

    class CollapseMonitor(TrainerCallback):
        def __init__(self):
            self.flags: dict[str, int] = {}
            self.stopped_at: int | None = None

        def on_log(self, args, state, control, logs=None, **kw):
            self.flags = detect(recorder.rows)
            if stop and self.flags and self.stopped_at is None:
                self.stopped_at = -(-int(state.global_step) // max(1, updates_per_step))
                control.should_training_stop = True

    return CollapseMonitor()
