"""Slurm's preemption signal in process: a stand-in for submitit's handler and a signal sent before a chosen step.

    requeue = fake_submitit()                    # USR2 goes to it, as under submitit (lorarl.train.checkpoint)
    signal_before_call(monkeypatch, 4)          # the pack loop's 4th step of this process starts with a USR2
    with pytest.raises(SystemExit): train_pack(...)
    assert requeue.calls == [signal.SIGUSR2]    # one requeue for the whole pack
"""

from __future__ import annotations

import os
import signal
from typing import Any


class FakeSubmitit:
    """What submitit's JobEnvironment does on USR2: checkpoint, requeue, exit (here: counted, then SystemExit(-1))."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def checkpoint_and_try_requeue(self, signum: int, frame: Any = None) -> None:
        self.calls.append(signum)
        raise SystemExit(-1)


FakeSubmitit.__module__ = "submitit.core.job_environment"  # lorarl.train.checkpoint recognises submitit by module


def fake_submitit() -> tuple[FakeSubmitit, Any]:
    """Install the stand-in as the USR2 handler; returns it and the handler it replaced (to put back)."""
    owner = FakeSubmitit()
    return owner, signal.signal(signal.SIGUSR2, owner.checkpoint_and_try_requeue)


def signal_before_call(monkeypatch: Any, call: int, sig: int = signal.SIGUSR2) -> list[int]:
    """Every pack built from now on sends ``sig`` to this process as the ``call``-th step of the process's pack loops
    begins (counted over every pack, 1-based). Returns the list of calls seen so far (one entry a step)."""
    from lorarl.pack import build

    real, seen = build.build_pack, []

    def built(*a: Any, **kw: Any) -> Any:
        pack = real(*a, **kw)
        step = pack.loop.step

        def step_with_signal() -> Any:
            seen.append(len(seen) + 1)
            if len(seen) == call:
                os.kill(os.getpid(), sig)
            return step()

        pack.loop.step = step_with_signal
        return pack

    monkeypatch.setattr(build, "build_pack", built)
    return seen
