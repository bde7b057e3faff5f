"""The hand-over of a packed member between its pack job and its own ``train`` job: one object, one state file.

Snakemake keeps ONE producer per cell output: the cell's ``train`` rule (same command, params and inputs with packing
on or off, so switching never reruns a finished cell). A pack job trains the member and STAGES its outputs in
``<cell>/.packed/`` (lorarl.pack.publish); the member's own ``train`` job moves them into place. The two meet
through one file per member, ``<cell>/.handover.json``, written atomically (:func:`lorarl.io.atomic_write_text`)
and read in one place (:meth:`HandOver.read`). Its states, each with the pack's id and its holder (pid, host):

    planned ──► claimed ──► staged ──► published        (released: the pack is done with it, not staged)

- ``planned``: Snakemake's ``onstart`` (nothing runs yet) plans every member of every pack job of the run, in its
  own name (:meth:`HandOver.plan`): a member's ``train`` job that starts before its pack's launcher waits for it;
- ``claimed``: the pack's launcher (``lorarl launch pack``) before it submits, in its own name (:meth:`claim`);
- ``staged``: the pack job staged the member's outputs (:func:`stage`: lorarl.pack.publish's, then :meth:`staged`);
- ``published``: the member's ``train`` job moved them into place (:meth:`take`);
- ``released``: the pack ended (or left the member out, or its holder is gone) without staging it: the member's
  ``train`` job trains it itself (from a pack checkpoint as a pack of one, else solo).

The member's side is :meth:`take`, the only wait: while a pack holds the member (planned or claimed, its holder
alive) and its outputs (or a rung job's staged mark) are not staged. Every wait is bounded and said once in the
member's log with its reason: ``claimed`` by its holder's life (the pack launcher, which ends with its job);
``planned`` by ``$LORARL_PACK_PENDING_S`` (300 s: a pack launcher that never started); a holder of another host,
whose process cannot be checked from here, by its heartbeat: a launcher touches its members' state files every
``BEAT_S`` (30 s, :class:`Heartbeat`) while it runs, and a claimed state of another host not touched for ``SILENT_S``
(180 s) is stale. A state whose holder is gone on this host
(a killed launcher or Snakemake) is stale: said once and marked released by the member that finds it, or said and
removed by the next ``snakemake`` (``onstart``, :func:`clear_stale`). No other module waits on a pack.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from lorarl import paths
from lorarl.io import atomic_write_text, pid_alive
from lorarl.pack import publish

__all__ = ["FILE", "PENDING_ENV", "STATES", "HandOver", "Heartbeat", "State", "claim_members", "clear_stale",
           "release_members", "stage"]

FILE = ".handover.json"  # <cell dir>/.handover.json: the member's hand-over state
PENDING_ENV = "LORARL_PACK_PENDING_S"  # a member's longest wait on a planned state for its pack's launcher
PENDING_S = 300.0  # its default: a pack launcher that never started
PLANNED, CLAIMED, STAGED, PUBLISHED, RELEASED = "planned", "claimed", "staged", "published", "released"
STATES = (PLANNED, CLAIMED, STAGED, PUBLISHED, RELEASED)
HELD = (PLANNED, CLAIMED)  # a pack holds the member: its train job waits (bounded)
BEAT_S = 30.0  # a live pack launcher touches its members' state files this often (Heartbeat)
SILENT_S = 180.0  # another host's claimed state untouched this long: its launcher is gone (6 missed beats)


@dataclass(frozen=True)
class State:
    """One member's hand-over state, as written."""

    state: str  # one of STATES
    pack: str  # the pack job's id (lorarl.pack.plan.pack_id)
    pid: int  # the holder's process: Snakemake (planned), the pack's launcher (claimed and after)
    host: str  # the holder's host (its pid means nothing elsewhere)
    at: float  # when it was written (time.time())
    reason: str = ""  # released: why

    def holder_gone(self) -> bool:
        """Its holder was a process of this host that no longer runs (another host's: see HandOver.silent)."""
        return self.host == socket.gethostname() and not pid_alive(self.pid)

    def elsewhere(self) -> bool:
        return self.host != socket.gethostname()


class HandOver:
    """The hand-over state of one member (``<cell dir>/.handover.json``): the pack's side writes it, the member's
    ``train`` job waits on it and publishes (:meth:`take`)."""

    def __init__(self, cell_dir: str | Path, label: str = ""):
        self.path = Path(cell_dir) / FILE
        self.label = label or f"train {Path(cell_dir).name}"  # the member's log lines start with it
        self.waited = False  # the last wait saw a pack hold the member (its end is then said)
        self.heartbeat: Heartbeat | None = None  # the launcher's touch on this state while it holds it

    @classmethod
    def of(cls, results_dir: str | Path, study: str, cell: str) -> "HandOver":
        return cls(paths.cell_dir(results_dir, study, cell), f"train {cell}")

    def read(self) -> State | None:
        """The state (None: none there, or not a state): the one reader of the file."""
        try:
            doc = json.loads(self.path.read_text())
            st = State(**doc)
        except (OSError, ValueError, TypeError):
            return None
        return st if st.state in STATES else None

    def _write(self, state: str, pack: str, holder: State | None = None, reason: str = "") -> State:
        pid, host = (holder.pid, holder.host) if holder else (os.getpid(), socket.gethostname())
        st = State(state, pack, pid, host, time.time(), reason)
        atomic_write_text(self.path, json.dumps(asdict(st), sort_keys=True) + "\n")  # a reader never sees half
        return st

    def silent_s(self) -> float:
        """Seconds since the state file was last written or touched (its holder's heartbeat); 0 when there is none."""
        try:
            return max(0.0, time.time() - self.path.stat().st_mtime)
        except OSError:
            return 0.0

    def beat(self) -> None:
        """The holder's heartbeat: touch the state file (never rewritten: a state staged meanwhile is kept)."""
        try:
            os.utime(self.path)
        except OSError:
            pass

    def held(self) -> bool:
        """A pack holds the member now: planned or claimed, its holder alive (or of another host)."""
        st = self.read()
        return st is not None and st.state in HELD and not st.holder_gone()

    # the pack's side
    def plan(self, pack: str) -> bool:
        """Snakemake's ``onstart``: planned for ``pack``, in this process's name; a member another live holder
        holds is left alone (False)."""
        if self.held():
            return False
        self._write(PLANNED, pack)
        return True

    def claim(self, pack: str) -> State:
        """The pack's launcher, before it submits: claimed, in its own name (replaces Snakemake's planned state)."""
        return self._write(CLAIMED, pack)

    def staged(self) -> None:
        """The pack job staged the member's outputs (lorarl.pack.publish.stage): the holder and pack kept."""
        st = self.read()
        self._write(STAGED, st.pack if st else "", holder=st)

    def release(self, pack: str, reason: str, mine: bool = False) -> bool:
        """The pack is done with the member without staging it (its launcher ended, or its job left it out): only
        a planned or claimed state of this pack is released (``mine``: only one this process holds)."""
        st = self.read()
        if st is None or st.state not in HELD or st.pack != pack or (mine and st.pid != os.getpid()):
            return False
        self._write(RELEASED, pack, holder=st, reason=reason)
        return True

    # the member's side
    def wait(self, ready: Callable[[], bool], poll_s: float = 1.0, pending_s: float | None = None) -> str:
        """Wait while a pack holds the member and ``ready()`` (its outputs, or its rung mark, of this config
        staged) is False; each wait said once, with its bound. Returns why it ended: ``ready``, ``none`` (no
        pack holds it), ``staged`` (staged for another config), ``published``, ``released``, ``stale`` (the
        holder is gone: said once, marked released), ``pending`` (planned longer than ``pending_s``)."""
        pending_s = float(os.environ.get(PENDING_ENV, PENDING_S)) if pending_s is None else pending_s
        planned_until, said, self.waited = time.time() + pending_s, "", False
        while True:
            if ready():
                return "ready"
            st = self.read()
            if st is None:
                return "none"
            if st.state not in HELD:
                return st.state
            if st.holder_gone():
                self.say(f"ignoring the stale hand-over of pack {st.pack} ({st.state}; holder process {st.pid} "
                         "is gone)")
                self._write(RELEASED, st.pack, holder=st, reason=f"holder process {st.pid} gone")  # said once
                return "stale"
            if st.state == CLAIMED and st.elsewhere() and (silent := self.silent_s()) > SILENT_S:
                self.say(f"ignoring the stale hand-over of pack {st.pack} (claimed on host {st.host}, not touched for "
                         f"{silent:.0f} s; a live launcher touches it every {BEAT_S:g} s)")
                self._write(RELEASED, st.pack, holder=st, reason=f"holder on {st.host} silent for {silent:.0f} s")
                return "stale"
            if st.state == PLANNED and time.time() > planned_until:
                self.say(f"its pack {st.pack} did not claim it in {pending_s:g} s (its launcher never started: see "
                         f".packs/{st.pack}.log); training it here")
                return "pending"
            why = (f"waiting for its pack {st.pack}: planned, its launcher not started yet (at most {pending_s:g} s)"
                   if st.state == PLANNED else f"its pack is training it ({st.pack}); waiting while its launcher "
                   f"(process {st.pid}) runs" + (f" (on host {st.host}: while it touches the state, at most "
                                                 f"{SILENT_S:g} s apart)" if st.elsewhere() else ""))
            if why != said:
                self.say(why)
                said, self.waited = why, True
            time.sleep(poll_s)

    def take(self, results_dir: str | Path, study: str, cell: str, config_hash: str, step: int | None = None,
             poll_s: float = 1.0) -> bool:
        """What a member's ``train`` job does first: wait (:meth:`wait`), then move what its pack staged into
        place (outputs; a rung job's ``step``: also its rung mark). True: a pack trained it for this job, nothing
        to submit; False: train it here."""
        from lorarl.train.until import mark_path, staged_mark_path

        staged_summary = paths.cell_dir(results_dir, study, cell) / ".packed" / "summary.json"
        mark = None if step is None else staged_mark_path(results_dir, study, cell, step)
        why = self.wait(lambda: _hash(mark if mark is not None else staged_summary) == config_hash, poll_s)
        published = publish.publish(results_dir, study, cell, config_hash)
        if step is None and published:
            self.say("trained in its pack; outputs moved into place")
        if step is None or _hash(mark) != config_hash:
            if not published and why in ("released", "staged") and self.waited:  # not an earlier run's state
                st = self.read()
                self.say(f"its pack {st.pack if st else '?'} ended without staging it for this config"
                         + (f" ({st.reason})" if st and st.reason else "") + "; training it here")
            return self._published(published) if step is None else False
        os.replace(mark, mark_path(results_dir, study, cell, step))
        self.say(f"trained to step {step} in its pack; rung mark moved into place")
        return self._published(True)

    def _published(self, done: bool) -> bool:
        st = self.read()
        if done and st is not None:
            self._write(PUBLISHED, st.pack, holder=st)
        return done

    def say(self, text: str) -> None:
        print(f"[lorarl] {self.label}: {text}", flush=True)


class Heartbeat:
    """A live launcher's touch on its members' state files every ``every_s`` (a daemon thread of the launcher: it
    ends with the process, or at :meth:`stop`), so that a member's job on another host can tell a live holder
    from a gone one (:data:`SILENT_S`)."""

    def __init__(self, handovers: list[HandOver], every_s: float = BEAT_S):
        self.handovers, self.every_s, self.done = handovers, every_s, threading.Event()
        self.thread = threading.Thread(target=self._run, name="lorarl-handover-heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            for h in self.handovers:
                h.beat()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def claim_members(results_dir: str | Path, study: str, cells: list[str], pack: str) -> list[HandOver]:
    """The pack launcher's claim on its members, before it submits (:meth:`HandOver.claim`), and its heartbeat on
    them until :func:`release_members`."""
    out = [HandOver.of(results_dir, study, c) for c in cells]
    for h in out:
        h.claim(pack)
    beat = Heartbeat(out, BEAT_S)
    for h in out:
        h.heartbeat = beat
    return out


def release_members(handovers: list[HandOver], pack: str, reason: str) -> None:
    """The pack launcher's end: its heartbeat stops, and the members it still holds (not staged, not left out) are
    released."""
    for beat in {id(h.heartbeat): h.heartbeat for h in handovers if h.heartbeat is not None}.values():
        beat.stop()
    for h in handovers:
        h.release(pack, reason, mine=True)


def stage(work: Path, cell_dir: Path) -> Path:
    """The pack job's staging of a member (lorarl.pack.publish.stage: its outputs to ``<cell dir>/.packed``), then
    its hand-over ``staged``: what the pack's cell runs call (lorarl.pack.run.claim_members)."""
    dst = publish.stage(work, cell_dir)
    HandOver(cell_dir).staged()
    return dst


def _hash(p: Path | None) -> str | None:
    try:
        return json.loads(p.read_text()).get("config_hash") if p is not None else None
    except (OSError, ValueError, AttributeError):
        return None


def clear_stale(results_dir: str | Path, study: str, cells: list[str]) -> list[Path]:
    """Snakemake's ``onstart``, before any job runs: remove the planned or claimed states whose holder is gone (a
    killed launcher or Snakemake; another host's claimed state: silent over ``SILENT_S``), each said in one line;
    the paths removed."""
    out = []
    for c in cells:
        ho = HandOver.of(results_dir, study, c)
        st = ho.read()
        silent = st is not None and st.state == CLAIMED and st.elsewhere() and ho.silent_s() > SILENT_S
        if st is None or st.state not in HELD or not (st.holder_gone() or silent):
            continue
        ho.path.unlink(missing_ok=True)
        gone = f"its holder on {st.host} silent for over {SILENT_S:g} s" if silent else f"holder process {st.pid} is gone"
        print(f"[lorarl] {study}/{c}: removed a stale pack hand-over ({st.pack}, {st.state}; {gone})", file=sys.stderr,
              flush=True)
        out.append(ho.path)
    return out
