"""Slurm's preemption signals for the cells one process trains: a solo job's one cell, or a pack's members.

    with catch([run.checkpoints for run in runs]) as caught:   # USR2 / SIGTERM: every cell of the group asked
        ... steps; each cell's step_end saves and stops (lorarl.train.checkpoint) ...
    ... close every cell that did not stop for the preemption (finished, stopped, paused at this step) ...
    caught.hand_over()                                          # ONE requeue (or exit) for the whole group

Under submitit, Slurm's USR2 (sent ``signal_delay_s`` before the time limit, or by ``scancel --signal=USR2``) sets
the request on EVERY cell of the group; each cell still running finishes its step, saves a checkpoint (with or
without ``train.checkpoint_every``) and stops; a cell that ends at that step anyway (its last step, a collapse, a
pause) ends as it would have. Then :meth:`Caught.hand_over` runs submitit's own handler (``checkpoint()`` ->
``scontrol requeue`` -> exit) once, when any cell stopped for it (or the job has cells waiting: a resident job's
queue); the requeued job resumes those cells. SIGTERM
(scancel, ``scontrol requeue``, a preemption with a grace time; submitit ignores it) does the same and exits with
128 + 15: whoever sent it requeues or cancels the job. Who joined the group first, and whether that cell is still
training when the signal comes, does not matter (tests/pack/test_pack_preemption.py).

Caught only when some cell of the group keeps checkpoints (``train.checkpoint_every``) and submitit's handler is the
one in place; otherwise the signal goes to submitit (or the default action) straight away, as for a job that keeps
no checkpoints.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator


def _preempt_signal() -> int:
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def _is_submitit_handler(h: Any) -> bool:
    owner = getattr(h, "__self__", None)
    return owner is not None and type(owner).__module__.startswith("submitit")


class Caught:
    """What a group's catch saw: the signal asked for (``requested``) and the one hand-over after it."""

    def __init__(self, group: list[Any], sig: int, previous: Any):
        self.group = group  # the cells' checkpoints (lorarl.train.checkpoint.CellCheckpoints)
        self.sig = sig  # the preemption signal (USR2 unless $SUBMITIT_PREEMPT_SIGNAL)
        self.previous = previous  # submitit's handler, called once at the hand-over

    @property
    def requested(self) -> bool:
        """A preemption signal or SIGTERM reached the process while the group trained."""
        return any(c.preempt_requested or c.terminate_requested for c in self.group)

    def hand_over(self, waiting: bool = False) -> None:
        """After every cell that did not stop for the preemption is closed: when any did, requeue (USR2: submitit's
        handler) or exit (SIGTERM). Nothing when none did (the signal came at each cell's last step), unless
        ``waiting``: the job has more cells to train (a resident job's queue), which the requeued job trains."""
        if not (any(c.stopped_for_preemption for c in self.group) or (waiting and self.requested)):
            return
        if any(c.preempt_requested for c in self.group) and self.previous is not None:
            print("[lorarl] checkpoint saved; handing over to submitit for the requeue", file=sys.stderr, flush=True)
            self.previous(self.sig, None)  # submitit: checkpoint() -> scontrol requeue -> sys.exit(-1)
            raise SystemExit(-1)  # not reached when submitit requeues (it raises); never train on
        print("[lorarl] checkpoint saved; exiting on SIGTERM", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGTERM)


@contextmanager
def catch(group: list[Any]) -> Iterator[Caught]:
    """While the process trains the cells of ``group``: the signals set the request on every cell (the module
    docstring). Yields the :class:`Caught` whose ``hand_over`` the host calls once its other cells are closed."""
    sig = _preempt_signal()
    previous = signal.getsignal(sig)
    if not (any(c.enabled for c in group) and _is_submitit_handler(previous)):
        yield Caught(group, sig, None)
        return

    def on_preempt(signum: int, frame: Any) -> None:
        for c in group:
            c.preempt_requested = time.time()
        print(f"[lorarl] caught {signal.Signals(signum).name}: checkpoint at the end of this step, then "
              f"requeue", file=sys.stderr, flush=True)

    def on_term(signum: int, frame: Any) -> None:
        for c in group:
            c.terminate_requested = time.time()
        print(f"[lorarl] caught {signal.Signals(signum).name}: checkpoint at the end of this step, then "
              f"exit", file=sys.stderr, flush=True)

    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(sig, on_preempt)
    signal.signal(signal.SIGTERM, on_term)
    try:
        yield Caught(group, sig, previous)
    finally:
        signal.signal(sig, previous)
        signal.signal(signal.SIGTERM, previous_term)
