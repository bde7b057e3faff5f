"""submitit's executors for lorarl's jobs, and the GPUs a local job sees."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import submitit

from lorarl.pipeline.jobs.slurm import slurm_parameters


def make_executor(kind: str, folder: Path, threads: int, slurm: dict[str, Any] | None = None,
                  name: str | None = None) -> submitit.AutoExecutor:
    if kind not in ("debug", "local", "slurm"):
        raise ValueError(f"unknown executor {kind!r}; allowed: debug, local, slurm")
    ctor, slurm_params = slurm_parameters(slurm) if kind == "slurm" else ({}, {})
    ex = submitit.AutoExecutor(folder=str(folder), cluster=kind, **ctor)
    params: dict[str, Any] = {"cpus_per_task": threads}
    if name:
        params["name"] = name
    if kind == "slurm":
        params.update(slurm_params)
    else:
        params["timeout_min"] = 24 * 60
        if kind == "local" and int((slurm or {}).get("tasks_per_node", 1)) > 1:  # a training job's ranks
            params["tasks_per_node"] = int(slurm["tasks_per_node"])
        if kind == "local":  # submitit's local jobs see only the GPUs asked for (none by default: CPU)
            gpus = local_gpus((slurm or {}).get("gpus_per_node"))
            params["gpus_per_node"] = len(gpus)  # submitit exports CUDA_VISIBLE_DEVICES=0..n-1
            if gpus != tuple(range(len(gpus))):  # the launcher sees other indices: the job sees the same
                params["local_setup"] = [f"export CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}"]
    ex.update_parameters(**params)
    return ex


def local_gpus(asked: Any = None, env: dict[str, str] | None = None, driver: Path = Path("/proc/driver/nvidia/gpus"),
               ) -> tuple[int, ...]:
    """The GPUs a local job sees: the launcher's own (``CUDA_VISIBLE_DEVICES`` when it lists indices, else every
    GPU the NVIDIA driver lists), the first ``asked`` of them when the profile's resources give
    ``gpus_per_node``. submitit's local executor otherwise sets ``CUDA_VISIBLE_DEVICES=""`` in every job, so a
    local study on a GPU machine trained on the CPU. Read without importing torch (the launcher stays light)."""
    env = os.environ if env is None else env
    seen = env.get("CUDA_VISIBLE_DEVICES")
    if seen is not None:
        ids = [x.strip() for x in seen.split(",") if x.strip()]
        gpus = tuple(int(x) for x in ids) if all(x.isdigit() for x in ids) else tuple(range(len(ids)))
    else:
        gpus = tuple(range(len(list(driver.iterdir())))) if driver.is_dir() else ()
    return gpus if asked is None else gpus[:int(asked)]
