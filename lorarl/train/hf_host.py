"""A cell run hosted on HF's Trainer (TRL's GRPOTrainer: the solo job, lorarl.train.main.train_cell).

    trainer = build_trainer(..., callbacks=callbacks(run, sharded))   # run.callbacks()
    attach(run, trainer, sharded)                                       # run.attach(trainer)
    train(run, trainer)                                                 # run.train(trainer)

The run (:class:`lorarl.train.cellrun.CellRun`) owns the bookkeeping; this module wires it into the Trainer's
callbacks: the recorder, snapshots, the collapse and divergence monitors, the checkpoint callback (its mark is
written before MLflow sees the steps it covers), rank 0's save/stop decision on every rank, the trainer's own
monitor state (adv/std peak, the vLLM freshness window) into each checkpoint and back from the one resumed.
"""

from __future__ import annotations

from typing import Any

from lorarl.train import ranks


def callbacks(run: Any, sharded: bool = False) -> list:
    """The trainer's callbacks, in order: no step past the end, none after a diverged/collapsed checkpoint, the
    recorder, snapshots (rank 0, or every rank when the weights are sharded: the gather is collective), the
    collapse monitor."""
    from lorarl.train.callbacks import NoStepPastTheEnd

    return [NoStepPastTheEnd(), _stopped_already(run), run.recorder,
            *([run.snapshots] if run.main or sharded else []), run.collapse_monitor]


def attach(run: Any, trainer: Any, sharded: bool = False) -> None:
    """Wire the run into a built trainer: FSDP2's snapshot gather, the divergence stop, the checkpoint callback
    (before the recorder) and, on several ranks, rank 0's save/stop on every rank; the trainer's monitors
    (adv/std peak, vLLM freshness) go into each checkpoint and come back from the one resumed."""
    import functools

    from lorarl.train.sharding import gathered_state_dict

    if sharded:  # FSDP2: every rank gathers the weights a snapshot saves (lorarl.train.sharding)
        run.snapshots.gather = functools.partial(gathered_state_dict, trainer)
    trainer.add_callback(run.divergence.callback())
    run.ckpt.attach(trainer, run.recorder)  # save every train.checkpoint_every steps and at the end
    if run.main and ranks.world_size() > 1:
        from lorarl.train.rank_checkpoints import attach_sync

        attach_sync(trainer, run.recorder, run.ckpt)  # the other ranks save and stop with rank 0
    fresh = getattr(trainer, "freshness", None)
    run.host_state = lambda: {"adv_std_peak": trainer._adv_std_peak,
                              **({"freshness_stale_steps": list(fresh.stale_steps)} if fresh else {})}
    trainer._adv_std_peak = float(run.monitors.get("adv_std_peak", trainer._adv_std_peak))
    if fresh is not None:
        fresh.stale_steps = list(run.monitors.get("freshness_stale_steps", []))


def train(run: Any, trainer: Any) -> None:
    """``trainer.train``, resumed from the run's checkpoint, under Slurm's preemption signals; a failure ends the
    MLflow run (KILLED or FAILED) and releases the lock. A run resumed at its ``stop_at`` pauses without a step."""
    from lorarl.train.callbacks import ResumedAtEnd

    start = int(run.resumed.step) // run.per if run.resumed is not None else 0  # checkpoints: at step ends
    if run.paused_before(ranks.broadcast(start)):
        return
    run.ready()  # the grading workers ready before step 1: their start is the job's start-up, not the step's
    try:
        with run.ckpt.preemption():  # Slurm's USR2: finish the step, checkpoint, then submitit requeues
            try:
                trainer.train(resume_from_checkpoint=run.ckpt.resume_from)
            except ResumedAtEnd:  # resumed from the last step's checkpoint: nothing left to train
                pass
    except BaseException as err:
        run.fail(err)
        raise
    run.ckpt.paused = ranks.broadcast(run.ckpt.paused)  # rank 0's checkpoint callback decided
    run.recorder.flush()
    run.collapse_at = run.collapse_step()


def _stopped_already(run: Any) -> Any:
    """A run resumed from a checkpoint whose cell had diverged or collapsed trains no step (the checkpoint's weights
    are loaded, then training ends: its outputs are those weights)."""
    from transformers import TrainerCallback

    from lorarl.train.callbacks import ResumedAtEnd

    class StoppedAlready(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if run.divergence.step is not None or run.collapse_at is not None:
                raise ResumedAtEnd(state.global_step)

    return StoppedAlready()
