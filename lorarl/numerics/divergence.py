"""Divergence: a non-finite loss, reward or gradient stops the cell with state `diverged`.

What a diverged cell is (decided here, used by train, status and aggregate):
* The non-finite update is never applied: just before the optimizer step, non-finite trainable
  gradients are dropped (`grad = None`, so the optimizer skips every parameter) and training stops
  at the end of that step. The saved adapter is therefore the last finite one (the weights after the
  previous step), and the evaluate and diagnose stages run on it like on any other cell.
* The metrics of every step, the non-finite one included, are kept in metrics.csv and MLflow.
* summary.json says `"state": "diverged"`, `"diverged_at_step"`, `"diverged_reason"`; the MLflow run
  gets the tag `lorarl.state=diverged`; `lorarl status` shows `diverged`; the aggregate tables count
  the diverged cells of each group. For Snakemake the cell is finished (its outputs exist and say
  so): the study completes, and deleting the cell's summary.json (or changing its config) retrains it.

Test hook: LORARL_FAULT="nan_reward_at_step:N" makes every reward of training step N (1-based) NaN,
which propagates through the advantages into the loss and the gradients exactly like a real NaN.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from lorarl.faulthooks import FAULT_ENV, number as fault_number

DONE, DIVERGED = "done", "diverged"
WATCHED = ("loss", "reward")  # logged keys whose non-finite value means divergence (plus rewards/*)


def nonfinite_keys(row: dict[str, Any]) -> list[str]:
    """The watched metrics of one logged row that are NaN or +-inf (TRL logs an all-NaN metric as None)."""
    out = []
    for k, v in row.items():
        if not (k in WATCHED or k.startswith("rewards/")):
            continue
        if v is None or isinstance(v, (int, float)) and not math.isfinite(v):
            out.append(k)
    return sorted(out)


def nan_reward_fault(deposits: Any, step: int) -> None:
    """The `nan_reward_at_step:N` test hook: every reward deposit of training step N (1-based) becomes
    NaN, so the advantages, the loss and the gradients go non-finite the way a real NaN reward would."""
    if fault_number("nan_reward_at_step") != step:
        return
    print(f"[lorarl] {FAULT_ENV}: rewards of step {step} set to NaN", file=sys.stderr, flush=True)
    for i, vals in enumerate(deposits.values):
        if vals:
            vals[:] = [float("nan")] * len(vals)
        else:
            deposits.add(i, 0, float("nan"))


class Divergence:
    """Watches one training run; `state`, `step` and `reason` go into summary.json."""

    def __init__(self, updates_per_step: int = 1) -> None:
        self.step: int | None = None  # the training step (rollout batch, train.steps' unit) that diverged
        self.update: int | None = None  # the optimiser update inside it (TRL's global step)
        self.reason = ""
        self.updates_per_step = max(1, int(updates_per_step))

    @property
    def state(self) -> str:
        return DIVERGED if self.step is not None else DONE

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        if self.step is not None:
            out.update(diverged_at_step=self.step, diverged_reason=self.reason)
            if self.updates_per_step > 1:
                out["diverged_at_update"] = self.update
        return out

    def mark(self, update: int, reason: str) -> None:
        """``update``: the optimiser update (TRL's global step); recorded as its training step."""
        if self.step is None:
            self.step, self.update, self.reason = -(-update // self.updates_per_step), update, reason
            at = f"step {self.step}" + (f" (update {update})" if self.updates_per_step > 1 else "")
            print(f"[lorarl] diverged at {at}: {reason}; stopping this cell (its metrics are kept)",
                  file=sys.stderr, flush=True)

    def check_grads(self, model: Any, step: int) -> bool:
        """Before the optimizer step: drop non-finite gradients (the update is skipped). True = diverged."""
        import torch

        params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        if not params:
            return False
        finite = torch.stack([torch.isfinite(p.grad).all() for p in params]).all().item()
        if finite:
            return False
        for p in params:
            p.grad = None
        self.mark(step, "non-finite gradient (update skipped)")
        return True

    def check_row(self, row: dict[str, Any], step: int) -> bool:
        bad = nonfinite_keys(row)
        if bad:
            self.mark(step, "non-finite " + ", ".join(bad))
        return bool(bad)

    def callback(self) -> Any:
        """The TrainerCallback (built lazily: importing this module stays free of transformers)."""
        from transformers import TrainerCallback

        owner = self

        class DivergenceCallback(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                if model is not None and owner.check_grads(model, int(state.global_step) + 1):
                    control.should_training_stop = True

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and owner.check_row(logs, int(state.global_step)):
                    control.should_training_stop = True

            def on_step_end(self, args, state, control, **kw):
                if owner.step is not None:
                    control.should_training_stop = True

        return DivergenceCallback()


def cell_state(summary: dict[str, Any] | None) -> str:
    """`done` / `diverged` from a summary.json (older summaries without a state are `done`)."""
    return (summary or {}).get("state", DONE)
