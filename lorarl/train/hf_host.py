"""The HF adapter of a cell run: TRL's GRPOTrainer (the solo job, lorarl.train.main.train_cell) hosting it.

    host = HFHost(run, resume, sharded)                                 # resume: run.open(...)'s record
    trainer = build_trainer(..., callbacks=host.callbacks())
    host.attach(trainer)
    host.train(trainer)                                                 # then run.close(...)

The run (:class:`lorarl.train.cellrun.CellRun`) owns the bookkeeping; this adapter turns the Trainer's callbacks
into the run's calls and hands it the run's parts: the recorder, snapshots, the collapse and divergence monitors,
the checkpoint callback (its mark is written before MLflow sees the steps it covers), rank 0's save/stop decision
on every rank, the trainer's own monitor state (adv/std peak, the vLLM freshness window) into each checkpoint and
back from the one resumed. The Trainer's own state is HF's; nothing here makes one up.
"""

from __future__ import annotations

from typing import Any

from lorarl.train import ranks


class HFHost:
    """One cell run on one HF Trainer (every rank builds its own)."""

    def __init__(self, run: Any, resume: Any, sharded: bool = False):
        """``resume``: the run's :class:`lorarl.train.cellrun.Resume`. ``sharded``: FSDP2 weights (every rank
        gathers for a snapshot)."""
        self.run, self.resume, self.sharded = run, resume, sharded

    def callbacks(self) -> list:
        """The trainer's callbacks, in order: no step past the end, none after a diverged/collapsed checkpoint, the
        recorder, snapshots (rank 0, or every rank when the weights are sharded: the gather is collective), the
        collapse monitor."""
        from lorarl.train.callbacks import NoStepPastTheEnd

        run = self.run
        return [NoStepPastTheEnd(), _stopped_already(self.resume), run.recorder,
                *([run.snapshots] if ranks.is_main() or self.sharded else []), run.collapse_monitor]

    def attach(self, trainer: Any) -> None:
        """Wire the run into a built trainer: FSDP2's snapshot gather, the divergence stop, the checkpoint callback
        (before the recorder) and, on several ranks, rank 0's save/stop on every rank; the trainer's monitors
        (adv/std peak, vLLM freshness) go into each checkpoint and come back from the one resumed."""
        import functools

        from lorarl.train.sharding import gathered_state_dict

        run, monitors = self.run, self.resume.monitors
        if self.sharded:  # FSDP2: every rank gathers the weights a snapshot saves (lorarl.train.sharding)
            run.snapshots.gather = functools.partial(gathered_state_dict, trainer)
        trainer.add_callback(run.divergence.callback())
        run.checkpoints.attach(trainer, run.recorder)  # save every train.checkpoint_every steps and at the end
        if ranks.is_main() and ranks.world_size() > 1:
            from lorarl.train.rank_checkpoints import attach_sync

            attach_sync(trainer, run.recorder, run.checkpoints)  # the other ranks save and stop with rank 0
        fresh = getattr(trainer, "freshness", None)
        run.host_state = lambda: {"adv_std_peak": trainer.adv_std_peak,
                                  **({"freshness_stale_steps": list(fresh.stale_steps)} if fresh else {})}
        trainer.adv_std_peak = float(monitors.get("adv_std_peak", trainer.adv_std_peak))
        if fresh is not None:
            fresh.stale_steps = list(monitors.get("freshness_stale_steps", []))

    def train(self, trainer: Any) -> None:
        """``trainer.train``, resumed from the run's checkpoint, under Slurm's preemption signals; a failure ends the
        MLflow run (KILLED or FAILED) and releases the lock. A run resumed at its ``stop_at`` pauses without a step."""
        from lorarl.train.callbacks import ResumedAtEnd

        run = self.run
        if self.resume.state == "paused":
            return
        run.ready()  # the grading workers ready before step 1: their start is the job's start-up, not the step's
        try:
            with run.preemption():  # Slurm's USR2: finish the step, checkpoint, then submitit requeues
                try:
                    trainer.train(resume_from_checkpoint=self.resume.path)
                except ResumedAtEnd:  # resumed from the last step's checkpoint: nothing left to train
                    pass
        except BaseException as err:
            run.fail(err)
            raise


def _stopped_already(resume: Any) -> Any:
    """A run resumed from a checkpoint whose cell had diverged or collapsed trains no step (the checkpoint's weights
    are loaded, then training ends: its outputs are those weights)."""
    from transformers import TrainerCallback

    from lorarl.train.callbacks import ResumedAtEnd

    class StoppedAlready(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if resume.state in ("diverged", "stopped"):
                raise ResumedAtEnd(state.global_step)

    return StoppedAlready()
