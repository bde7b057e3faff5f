"""A pack job on several ranks: its members placed over the ranks, each rank a pack of its own.

    place(["c0", "c1", "c2"], rank=1, world=2)   # -> ["c1"]: member i trains on rank i mod W

A pack's members never exchange anything (each its own adapter, optimiser, data order and sampling
generator; the base is frozen), and a pack of K trains what K packs of one train (lorarl.pack.steps). So a
pack job of W ranks (the profile's train layout for the members' model, launched by submitit as one task per
GPU, as a training job's ranks are) gives rank ``r`` the members ``r, r+W, ...``: each rank loads the base on
its own GPU and trains its share as a pack, and every member trains exactly what it trains on one rank. No
gradient crosses ranks; a member's batch is never split (a member too big for one GPU is not a pack member:
train it solo on a layout of several ranks). Each rank writes its members' outputs, checkpoints and MLflow
runs (one writer per member); rank 0 writes the pack's record once every rank has reported.

Rendezvous: torch.distributed's ``TCPStore`` on the job's first node (``MASTER_ADDR``/``MASTER_PORT``, from
submitit's job environment: lorarl.pipeline.jobs.train_layout.export_ranks), not a process group, so a rank's
own vLLM engine (``rollout.engine: vllm``) starts as in a one-rank pack. Every rank beats a counter while it
trains; a rank that fails says so, and one that stops beating (killed) for ``LORARL_COLLECTIVE_TIMEOUT_S``
fails the job instead of leaving rank 0 waiting. Members another rank has staged stay staged: a rerun of
the pack leaves them out.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from typing import Any

BEAT_S = 5.0  # seconds between a rank's heartbeats


def world() -> tuple[int, int]:
    """(rank, world size) of this pack job (submitit's tasks or torchrun; (0, 1) for one process)."""
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def place(members: list[Any], rank: int, world: int) -> list[Any]:
    """This rank's members: every ``world``-th from ``rank`` (the pack's order)."""
    return list(members[rank::world])


def pin_gpu() -> None:
    """Make this rank's GPU (``LOCAL_RANK`` of the node's visible GPUs) the only one it sees, so its
    members, teacher and PRM resolve to it as in a one-GPU pack. Call before CUDA is initialised."""
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[local] if local < len(visible) else str(local)


def one_process() -> None:
    """From here this process is a one-process job: torch.distributed's variables say world 1 on a free local
    port, so what reads them (vLLM's in-process ``external_launcher`` engine) starts as in a one-rank pack.
    Call after the :class:`Rendezvous` has read the job's."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)


def _timeout_s() -> float:
    return float(os.environ.get("LORARL_COLLECTIVE_TIMEOUT_S", "600") or 600)


class Rendezvous:
    """The ranks of one pack job meeting at the end (see the module docstring)."""

    def __init__(self, pack_id: str, rank: int, world: int):
        self.rank, self.world, self.prefix = rank, world, f"lorarl/{pack_id}/"
        self.host, self.port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun hosts the store itself
        self.store = self._connect(rank == 0)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beating, daemon=True)
        self._beat.start()

    def _connect(self, master: bool) -> Any:
        from torch.distributed import TCPStore

        return TCPStore(self.host, self.port, is_master=master and not self.agent, wait_for_workers=False,
                        timeout=timedelta(seconds=max(_timeout_s(), 60)))

    def _beating(self) -> None:
        store = self._connect(False)  # a client of its own: the main thread's store stays free
        while not self._stop.wait(min(BEAT_S, _timeout_s() / 3)):
            try:
                store.add(f"{self.prefix}beat/{self.rank}", 1)
            except Exception:  # noqa: BLE001 - rank 0 gone: the job is failing anyway
                return

    def report(self, payload: dict) -> None:
        """This rank's outcome (``{"error": ...}`` for a failure), for rank 0."""
        self._stop.set()
        self.store.set(f"{self.prefix}done/{self.rank}", json.dumps(payload))

    def gather(self) -> list[dict]:
        """Rank 0: every rank's report, in rank order, once all have reported. Raises when a rank failed or
        stopped beating for the collective timeout."""
        keys = {r: f"{self.prefix}done/{r}" for r in range(self.world)}
        seen = {r: (-1, time.monotonic()) for r in keys}
        while True:
            missing = [r for r, k in keys.items() if not self.store.check([k])]
            if not missing:
                break
            for r in missing:
                n = self.store.add(f"{self.prefix}beat/{r}", 0)
                if n != seen[r][0]:
                    seen[r] = (n, time.monotonic())
                elif r != self.rank and time.monotonic() - seen[r][1] > _timeout_s():
                    raise RuntimeError(f"pack rank {r} stopped answering for {_timeout_s():.0f}s "
                                       "(LORARL_COLLECTIVE_TIMEOUT_S): killed?")
            time.sleep(1.0)
        reports = [json.loads(self.store.get(keys[r])) for r in range(self.world)]
        failed = {r: p["error"] for r, p in enumerate(reports) if "error" in p}
        if failed:
            raise RuntimeError("pack ranks failed: " + "; ".join(f"rank {r}: {e}" for r, e in failed.items()))
        return reports
