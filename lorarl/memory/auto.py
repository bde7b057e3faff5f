"""At job start: the memory knobs set to ``auto`` and the teacher / PRM devices, resolved for this job.

* ``train.micro_batch_size: auto`` / ``rollout.generation_batch_size: auto``: on a GPU, the memory plan's
  largest values for the free memory ``torch.cuda.mem_get_info()`` reports on the job's GPU (before the
  model loads; the plan counts the weights), per rank when the job runs ``WORLD_SIZE`` ranks (each its
  share of the batch); on a CPU job, null (the whole batch).
* ``reward.teacher_device`` / ``reward.prm_device``: where the job's GPUs are. Two or more GPUs: a
  ``cuda:N`` the job has is kept, anything else on CUDA (null, a ``cuda:N`` it lacks) becomes ``cuda:1``,
  the second GPU; one GPU: the policy's ``cuda:0`` (null stays null: the policy's device); no GPU: null (the policy's CPU). Other devices
  (``cpu``) are kept.

Every change is printed (``[lorarl] memory plan: ...``) and lands in the cell's recorded config; none is in
the training signature (runtime fields, or devices).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

def place_aux(setting: str | None, gpus: int) -> str | None:
    """Where an auxiliary model goes on a job with ``gpus`` GPUs (see the module docstring)."""
    if setting is not None and not setting.startswith("cuda"):
        return setting
    if gpus <= 0:
        return None
    if gpus == 1:
        return None if setting is None else "cuda:0"
    index = setting.split(":", 1)[1] if setting and ":" in setting else None
    return setting if index is not None and index.isdigit() and int(index) < gpus else "cuda:1"


def world_size() -> int:
    """Training ranks of this job: torchrun's ``WORLD_SIZE`` (1 when unset: one process)."""
    import os

    return int(os.environ.get("WORLD_SIZE") or 1)


def resolve_job(cfg: Any, gpus: int | None = None, free_bytes: int | None = None,
                log: Callable[[str], None] = print, results_dir: str = "results", world: int | None = None) -> Any:
    """``cfg`` with its ``auto`` memory knobs and auxiliary devices resolved for this job (a copy). ``world``:
    the ranks that share this cell's batch (default ``WORLD_SIZE``; a pack rank trains its members alone: 1)."""
    world = world_size() if world is None else world
    if gpus is None or (gpus > 0 and free_bytes is None):
        import torch

        gpus = torch.cuda.device_count() if gpus is None else gpus
        if gpus > 0 and free_bytes is None:
            free_bytes = torch.cuda.mem_get_info()[0]
    from lorarl.rewards.registry import extra_models  # the teacher / PRM the regime loads, and its device field

    aux = [x.device_field for x in extra_models(cfg.reward) if x.device_field]
    reward = cfg.reward.model_copy(update={f: place_aux(getattr(cfg.reward, f), gpus) for f in aux})
    for f in aux:
        if getattr(reward, f) != getattr(cfg.reward, f):
            log(f"[lorarl] memory plan: reward.{f} {getattr(cfg.reward, f)} -> {getattr(reward, f)} "
                f"(this job has {gpus} GPU(s))")
    train, rollout = cfg.train, cfg.rollout
    if rollout.tensor_parallel_size > 1 and world % rollout.tensor_parallel_size:  # groups of whole ranks
        tp = math.gcd(rollout.tensor_parallel_size, world)
        log(f"[lorarl] memory plan: rollout.tensor_parallel_size {rollout.tensor_parallel_size} -> {tp} ({world} ranks)")
        rollout = rollout.model_copy(update={"tensor_parallel_size": tp})
    wants = train.micro_batch_size == "auto" or rollout.generation_batch_size == "auto"
    p = None
    from lorarl.memory.arch import PlanError
    from lorarl.memory.cells import plan_cell
    from lorarl.memory.plan import GIB

    if train.sharding == "auto" and world > 1:  # DDP or FSDP2: the plan's strategy, what the trainer runs
        sharding = "fsdp2" if cfg.adapter.method == "full" else "ddp"  # no GPU: no budget to exceed
        if gpus > 0:
            try:
                p = plan_cell(cfg, free_bytes / GIB, gpus=gpus, device="cuda", results_dir=str(results_dir),
                              world=world)
                sharding = "fsdp2" if p.strategy == "fsdp2" else "ddp"
            except PlanError as err:
                log(f"[lorarl] memory plan: {err}; train.sharding auto by the method alone")
        log(f"[lorarl] memory plan: train.sharding auto -> {sharding} ({world} ranks)")
        train = train.model_copy(update={"sharding": sharding})
        cfg = cfg.model_copy(update={"train": train})
    if wants and gpus > 0:
        try:
            p = p or plan_cell(cfg, free_bytes / GIB, gpus=gpus, device="cuda", results_dir=str(results_dir),
                               world=world)  # per rank: its share of the batch
        except PlanError as err:
            raise ValueError(f"train.micro_batch_size / rollout.generation_batch_size auto need the memory plan: "
                             f"{err}; or set them to a number of sequences") from None
        m, g = max(p.max_micro_batch, 1), max(p.max_generation_batch, 1)
        log(f"[lorarl] memory plan: {free_bytes / GIB:.1f} GiB free on the job's GPU; projected peak "
            f"{p.peak_gb:.1f} GiB at micro-batch {m} of {p.rows}, generation chunk {g} of {p.batch}"
            + ("" if p.max_micro_batch and (p.max_generation_batch or rollout.engine != "hf") else
               "; the plan projects that not even 1 sequence fits: running 1 (expect out-of-memory)"))
    else:
        m = g = None
        if wants:
            log("[lorarl] memory plan: no GPU: micro_batch_size / generation_batch_size auto = the whole batch")
    if train.micro_batch_size == "auto":
        train = train.model_copy(update={"micro_batch_size": m})
    if rollout.generation_batch_size == "auto":
        rollout = rollout.model_copy(update={"generation_batch_size": g})
    return cfg.model_copy(update={"train": train, "rollout": rollout, "reward": reward})


def job_cell(cell: Any, **kwargs: Any) -> Any:
    """The cell with :func:`resolve_job`'s config (id, hash and aliases unchanged: runtime settings)."""
    return replace(cell, config=resolve_job(cell.config, **kwargs))
