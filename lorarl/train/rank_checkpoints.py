"""Checkpoints of a cell trained on several ranks: rank 0 owns them, the other ranks follow.

Rank 0 runs :class:`lorarl.train.checkpoint.CellCheckpoints` as one process does (the cell's lock, the
resume decision, ``lorarl.json`` marks, progress, MLflow's high-water mark). The other ranks hold a
:class:`FollowerCheckpoints`: no lock, no files; they resume from the checkpoint rank 0 chose (broadcast),
save when rank 0 saves (the HF Trainer's save is collective: each rank writes its RNG state, FSDP gathers
its shards) and stop when rank 0 stops for a preemption (:class:`StepSync`, one small broadcast per
update). :class:`SaveBarrier` holds rank 0's mark until every rank's files of the checkpoint are written,
so a checkpoint with its mark is complete for every rank.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from transformers import TrainerCallback

from lorarl.train import ranks


class FollowerCheckpoints:
    """What a rank other than 0 needs of the cell's checkpoints (the interface train_cell uses)."""

    waited_for_lock = False
    elapsed_before = 0.0

    def __init__(self, results_dir: Any, study: str, cell: Any) -> None:
        from lorarl import paths

        self.root = paths.pattern("checkpoints", results=str(results_dir), study=study, cell=cell.id)  # rank 0's
        self.resume_from: str | None = None  # rank 0's choice (train_cell broadcasts it)
        self.stopped_for_preemption = False  # set by StepSync when rank 0 stops for a preemption

    def restore(self, recorder: Any, run_id: str) -> None:
        recorder.log_only_saved = False  # it writes nothing anyway (MetricsRecorder(write=False))

    def attach(self, trainer: Any, recorder: Any) -> None:
        attach_sync(trainer, recorder, owner=self)

    @contextmanager
    def preemption(self) -> Iterator[None]:
        yield  # rank 0 catches the signal; StepSync stops this rank with it, after the common save
        if self.stopped_for_preemption:
            print(f"[lorarl] rank {ranks.rank()}: rank 0 stopped for a preemption; checkpoint saved, exiting",
                  flush=True)
            raise SystemExit(-1)

    def release(self, remove_dir: bool = False) -> None:
        pass

    def finish(self) -> None:
        pass


class StepSync(TrainerCallback):
    """After every update: rank 0's save/stop decision on every rank (after rank 0's checkpoint callback)."""

    def __init__(self, owner: Any):
        self.owner = owner  # rank 0's CellCheckpoints, or this rank's FollowerCheckpoints

    def on_step_end(self, args, state, control, **kw):
        decision = (bool(control.should_save), bool(control.should_training_stop),
                    bool(getattr(self.owner, "stopped_for_preemption", False)))
        save, stop, preempted = ranks.broadcast(decision)
        control.should_save, control.should_training_stop = save, stop
        self.owner.stopped_for_preemption = preempted
        return control


class SaveBarrier(TrainerCallback):
    """Every rank's checkpoint files are written before rank 0 marks the checkpoint complete."""

    def on_save(self, args, state, control, **kw):
        ranks.barrier()


def attach_sync(trainer: Any, recorder: Any, owner: Any) -> None:
    """Insert SaveBarrier before, and StepSync after, rank 0's checkpoint callback (or the recorder)."""
    cbs = trainer.callback_handler.callbacks
    ckpt_cb = next((c for c in cbs if type(c).__name__ == "CheckpointCallback"), None)
    at = cbs.index(ckpt_cb) if ckpt_cb is not None else (cbs.index(recorder) if recorder in cbs else len(cbs))
    cbs.insert(at, SaveBarrier())
    cbs.insert(at + (2 if ckpt_cb is not None else 1), StepSync(owner))
