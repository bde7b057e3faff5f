"""A cell's state at a step boundary: ONE checkpoint format, whatever hosts the cell.

    results/<study>/.checkpoints/<cell>/checkpoint-<step>/
        lorarl.json      written LAST (the mark of a complete checkpoint; lorarl.train.checkpoint): config hash,
                         MLflow run id, step, the metric rows so far, the file manifest, the ENGINE whose
                         streams the state carries ("format") and the cell run's monitor state ("monitors")
        <engine files>   the trainer's own state (below)
    results/<study>/.checkpoints/<cell>/paused.json   the run ended paused at this checkpoint (a host's stop_at)

The monitor state (:func:`monitor_state` / :func:`apply_monitors`) is host-independent, JSON: divergence (step,
update, reason), the collapse stop's step, the running peak of the advantage std (``adv/std_peak``) and the
vLLM freshness gate's run of stale steps. The collapse flags themselves are a function of the metric rows, which
the mark holds, and the snapshots already written are files of the cell; the KL monitors keep nothing from one step
to the next (they measure the batch just trained), nor do DAPO's refills (their draws are functions of the step).

Engines (what the weights, optimiser, schedule, RNG streams and data cursor look like on disk):

* ``hf``: the solo trainer (TRL's GRPOTrainer through HF's Trainer). HF's checkpoint files: adapter (or model),
  AdamW moments and step, the LR schedule, every RNG stream of every rank (python, numpy, torch CPU and CUDA:
  the rollout uniforms and any dropout), the trainer state (global step: the data cursor, HF skips the batches
  already drawn). The rollout seeds of vLLM (lorarl.train.vllm_seeds) and DAPO's refill draws
  (lorarl.train.dynamic_sampling) are functions of (seed, step), nothing to save.
* ``pack``: the packed step loop (lorarl.pack). ``cell_state.pt``: the trainable weights BY NAME (a member's
  names are its own PEFT model's, the same in every pack position), AdamW state, LR schedule, the data order
  (generator, permutation, cursor) and the sampling generator (HF rollouts draw their uniforms from it, vLLM
  rollouts their request seeds), the step. Nothing in it names a pack, a position or a pack-mate, so a cell
  saved in one pack resumes in any other pack, at any position, beside members of any rank, or alone (a pack
  of one, in its own ``train`` job), and continues as its uninterrupted run (tests/train/test_cell_leaves.py).

The two engines train one cell to the same result (docs/packed.md, "one cell, one result"), but their saved states
differ in form (TRL's checkpoint folder, the pack's state file), so a state resumes only in a host of its own engine
(another raises ``WrongHost`` before anything is written): a single-cell job
takes whichever engine the state names (lorarl.pipeline.jobs.stages), a pack leaves out a cell with an ``hf`` state
(its own job resumes it) instead of discarding its progress.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENGINE_FILE = "cell_state.pt"
_OLD_ENGINE_FILE = "pack_state.pt"  # the pack's file before this format (same content, read too)
PAUSED = "paused.json"


def save_engine(folder: Path, model: Any, optimizer: Any, scheduler: Any, streams: dict, step: int) -> None:
    """The ``pack`` engine's state of one cell into ``folder`` (written to a temporary name, then renamed)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (ENGINE_FILE + ".tmp")
    torch.save({"weights": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict() if scheduler else None,
                "streams": streams, "step": int(step)}, tmp)
    os.replace(tmp, folder / ENGINE_FILE)


def load_engine(folder: Path, model: Any, optimizer: Any, scheduler: Any) -> tuple[dict, int]:
    """Load a ``pack`` engine state into a cell's model, optimiser and schedule; returns (streams, step).
    Refuses, naming them, weights the model does not have or has in another shape (another cell's state)."""
    import torch

    path = folder / ENGINE_FILE
    st = torch.load(path if path.exists() else folder / _OLD_ENGINE_FILE, map_location="cpu", weights_only=True)
    weights = st.get("weights", st.get("adapter"))
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if weights.keys() != params.keys() or any(weights[n].shape != params[n].shape for n in params):
        bad = sorted(set(weights) ^ set(params)) or [n for n in params if weights[n].shape != params[n].shape]
        raise ValueError(f"{folder}: the saved weights are not this cell's trainable weights ({bad[:3]} ...)")
    with torch.no_grad():
        for n, v in weights.items():
            params[n].copy_(v)
    optimizer.load_state_dict(st["optimizer"])
    if scheduler is not None and st["scheduler"] is not None:
        scheduler.load_state_dict(st["scheduler"])
    streams = st.get("streams") or {"data_order": st["order"], "sampler": st["sampler"]}
    return streams, int(st["step"])


def monitor_state(divergence: Any, collapse_at: int | None, host: dict | None = None) -> dict:
    """The cell run's monitors as JSON: divergence, the collapse stop, and the host's (``adv_std_peak``,
    ``freshness_stale_steps``)."""
    return {"divergence": {"step": divergence.step, "update": divergence.update, "reason": divergence.reason},
            "collapse_at": collapse_at, **(host or {})}


def apply_monitors(state: dict, divergence: Any) -> int | None:
    """Restore a saved :func:`monitor_state` into ``divergence``; returns the collapse stop's step (or None)."""
    d = state.get("divergence") or {}
    divergence.step, divergence.update, divergence.reason = d.get("step"), d.get("update"), d.get("reason", "")
    return state.get("collapse_at")


def waiting_engine(results_dir: str | Path, study: str, cell: Any) -> str | None:
    """The engine of the state this cell would resume from (its newest complete checkpoint of this config, the
    cell not finished), or None. Read without the cell's lock: a host's choice, confirmed when it takes the lock."""
    from lorarl import paths
    from lorarl.train.checkpoint import COMPLETE, complete_checkpoints

    root = Path(paths.pattern("checkpoints", results=str(results_dir), study=study, cell=cell.id))
    if (root / COMPLETE).exists():
        return None
    mine = [c for c in complete_checkpoints(root) if c.meta.get("config_hash") == cell.hash]
    return mine[-1].meta.get("format", "hf") if mine else None
