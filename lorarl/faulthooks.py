"""The test hooks of ``LORARL_FAULT``: each one named here with its argument, and the one parser every reader calls.

A hook makes a real failure happen where it would happen in a job (a SIGKILL, a NaN reward, CUDA out of memory, a
full disk), so the tests and the fault drills exercise the code that handles it. The variable holds one hook:
``<name>:N`` for a hook with a number, ``<name>`` for one without. A value that names no hook, or a number that is
not a whole number within the hook's range, is refused with the hook's name and the allowed values, at the first
reader. This module imports nothing of lorarl: the lowest readers (lorarl.io, lorarl.numerics) use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from collections.abc import Mapping

FAULT_ENV = "LORARL_FAULT"  # the one environment variable of the test hooks (docs/contributing.md's table)


@dataclass(frozen=True)
class Hook:
    name: str  # the value's name part: `LORARL_FAULT=<name>[:N]`
    unit: str  # what N counts ("" for a hook without a number): named in the error of a bad N
    minimum: int  # the smallest N that means something (steps count from 1; a 0 threshold fails every job)
    reader: str  # where it fires: the module whose code acts on it (for the docs and the error)


HOOKS: dict[str, Hook] = {h.name: h for h in (
    Hook("kill_at_step", "training step", 1, "lorarl.train.checkpoint: SIGKILL at the end of step N"),
    Hook("kill_after_save", "training step", 1, "lorarl.train.checkpoint: SIGKILL once step N's checkpoint is complete"),
    Hook("nan_reward_at_step", "training step", 1, "lorarl.numerics.divergence: every reward of step N is NaN"),
    Hook("flat_prompts", "divisor", 1, "lorarl.train.dynamic_sampling: prompts with crc32 % N == 0 get reward 0"),
    Hook("oom_above", "sequences", 0, "lorarl.pipeline.jobs.oom: out of memory above N sequences per micro-batch"),
    Hook("oom_ranks_below", "ranks", 0, "lorarl.pipeline.jobs.oom: a training job of fewer than N ranks runs out of memory"),
    Hook("step_delay_ms", "milliseconds", 1, "lorarl.train.checkpoint: every training step ends N ms later (a job "
         "slow enough to be signalled while it trains)"),
    Hook("disk_full", "", 0, "lorarl.io.disk_full_hook: a train cell's summary.json write fails with ENOSPC"),
)}


@dataclass(frozen=True)
class Fault:
    hook: str  # a name of HOOKS
    n: int | None  # its number; None for a hook without one


def allowed() -> str:
    """The allowed values, as a user writes them."""
    return ", ".join(f"{h.name}:N" if h.unit else h.name for h in HOOKS.values())


def parse(raw: str) -> Fault | None:
    """The hook a value of LORARL_FAULT sets; None for an empty value. ValueError names the hook and the allowed
    values when the name is unknown or its number is missing, not a whole number or below the hook's minimum."""
    if not raw:
        return None
    name, colon, value = raw.partition(":")
    hook = HOOKS.get(name)
    if hook is None:
        raise ValueError(f"{FAULT_ENV}={raw!r}: unknown hook {name!r}; allowed: {allowed()}")
    if not hook.unit:
        if colon:
            raise ValueError(f"{FAULT_ENV}={raw!r}: {name} takes no number; allowed: {allowed()}")
        return Fault(name, None)
    if not value.isdigit() or int(value) < hook.minimum:
        raise ValueError(f"{FAULT_ENV}={raw!r}: {name}:N needs a whole number N >= {hook.minimum} "
                         f"({hook.unit}); allowed: {allowed()}")
    return Fault(name, int(value))


def active(env: Mapping[str, str] | None = None) -> Fault | None:
    """The hook set in the environment (``env``: os.environ), parsed."""
    return parse((os.environ if env is None else env).get(FAULT_ENV, ""))


def number(name: str, env: Mapping[str, str] | None = None) -> int | None:
    """N of hook ``name`` when the environment sets that hook, else None (another hook, or none)."""
    if name not in HOOKS or not HOOKS[name].unit:
        raise ValueError(f"hook {name!r}: no hook with a number of that name; allowed: "
                         + ", ".join(h.name for h in HOOKS.values() if h.unit))
    fault = active(env)
    return fault.n if fault is not None and fault.hook == name else None


def is_set(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment sets hook ``name`` (a hook without a number: disk_full)."""
    if name not in HOOKS:
        raise ValueError(f"unknown hook {name!r}; allowed: {', '.join(HOOKS)}")
    fault = active(env)
    return fault is not None and fault.hook == name


def without(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the hook: what a driver hands a process that must run clean."""
    return {k: v for k, v in env.items() if k != FAULT_ENV}
