"""Adapter snapshots during training (``eval.eval_every``): what the pass@1-over-training curve
evaluates.  Imported by the trainer only (it needs transformers)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

from transformers import TrainerCallback

__all__ = ["SnapshotSaver"]


class SnapshotSaver(TrainerCallback):
    """At each training step in ``steps`` (rollout steps: the end of that step's last optimiser update), save the policy to ``<root>/step-<N>`` with ``save(path, model)``
    (the trainer passes ``AdaptedPolicy.save``: residual inits are saved relative to the original
    base, exactly like the final adapter).  A full model also gets the tokenizer, so the snapshot
    loads on its own.  Each snapshot is written to a temporary folder and renamed into place; a
    rerun (or a resumed run) overwrites the snapshots it reaches again."""

    def __init__(self, root: str | Path, steps: Iterable[int], save: Callable[..., Any],
                 tokenizer: Any = None, updates_per_step: int = 1,
                 gather: Callable[[], dict | None] | None = None) -> None:
        self.root = Path(root)
        self.updates_per_step = int(updates_per_step)  # TRL's global step counts optimiser updates
        self.steps = set(int(s) for s in steps)
        self.save = save
        self.tokenizer = tokenizer
        self.saved: list[int] = []
        self.gather = gather  # FSDP2: every rank calls it (a collective), rank 0 saves what it returns

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if int(state.global_step) % self.updates_per_step:
            return  # inside a training step (between its mini-batch updates)
        step = int(state.global_step) // self.updates_per_step
        if step not in self.steps or model is None:
            return
        state_dict = self.gather() if self.gather is not None else None  # sharded: on every rank
        if state.is_world_process_zero:
            self.save_step(step, model, state_dict)

    def fill_after_stop(self, model: Any, state_dict: dict | None = None) -> list[int]:
        """Training ended early (train.stop_on_collapse): the policy stays as it is, so the planned
        snapshots it never reached are that final policy (the evaluations expect every step)."""
        missing = sorted(s for s in self.steps if s not in self.saved and not (self.root / f"step-{s}").exists())
        for step in missing:
            self.save_step(step, model, state_dict)
        return missing

    def save_step(self, step: int, model: Any, state_dict: dict | None = None) -> None:
        from lorarl import ledger

        with ledger.phase("checkpoint"):  # a snapshot's write (lorarl.ledger)
            self._save_step(step, model, state_dict)

    def _save_step(self, step: int, model: Any, state_dict: dict | None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        dst = self.root / f"step-{step}"
        tmp = self.root / f".step-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        if state_dict is not None:
            self.save(tmp, model, state_dict=state_dict)
        else:
            self.save(tmp, model)
        if not (tmp / "adapter_config.json").exists() and self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)  # a full model: loadable on its own
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
        self.saved.append(step)
