"""The layout of a cell's training job (nodes x ranks per node): runtime, from the profile, never the study.

The profile's ``slurm.train`` resources say how many nodes and GPUs one training job gets; one rank (one
process, one submitit task) per GPU, so a job of ``nodes x gpus_per_node`` GPUs trains on that many ranks
(lorarl.memory.ranks: DDP for an adapter cell, FSDP2 for full fine-tuning). ``tasks_per_node`` set
explicitly wins (CPU ranks in the tests: no GPUs). A cell with a teacher / HF PRM on one node of 2 GPUs
trains on one rank and puts the teacher on the second GPU (paper 001; lorarl.memory.auto.place_aux).

A study gets the layout its size needs without editing ``slurm.train`` for each study::

    slurm:
      train:
        gpus_per_node: 1
        layouts:                      # overrides of the keys above for the cells they match
          by_model:  {Qwen/Qwen2.5-7B: {gpus_per_node: 8}}
          by_study:  {paper004_h200: {nodes: 4, gpus_per_node: 8}}   # a study's wins over its model's
          on_oom:    {gpus_per_node: 4}   # the larger layout of the last out-of-memory retry (lorarl.pipeline.jobs.oom)

The layout never enters a cell's training signature (it is not in the cell config), so the same cell trained
on 1 GPU or on 32 is the same cell, and its outputs are the same to float rounding (tests/train/test_distributed.py).

In a job of several tasks, :func:`export_ranks` sets torch.distributed's rendezvous (MASTER_ADDR/PORT, RANK,
WORLD_SIZE, LOCAL_RANK) from submitit's job environment (``submitit.helpers.TorchDistributedEnvironment``);
each rank then runs ``train_cell`` under accelerate (lorarl.train.ranks).
"""

from __future__ import annotations

import os
from typing import Any

OVERRIDES = ("by_model", "by_study", "on_oom")


def _layouts(resources: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    res = dict(resources or {})
    layouts = res.pop("layouts", None) or {}
    if not isinstance(layouts, dict) or set(layouts) - set(OVERRIDES):
        bad = sorted(set(layouts) - set(OVERRIDES)) if isinstance(layouts, dict) else layouts
        raise ValueError(f"slurm.train.layouts: unknown keys {bad}; allowed: {', '.join(OVERRIDES)}")
    return res, layouts


def train_resources(resources: dict[str, Any] | None, study: str, model: str) -> dict[str, Any]:
    """``slurm.train`` of the profile with the per-model, then per-study override applied (``layouts`` removed)."""
    res, layouts = _layouts(resources)
    if layouts.get("on_oom") is not None and not isinstance(layouts["on_oom"], dict):
        raise ValueError(f"slurm.train.layouts.on_oom: a mapping of slurm.train keys; got {layouts['on_oom']!r}")
    for key, name in (("by_model", model), ("by_study", study)):
        over = (layouts.get(key) or {}).get(name)
        if over is not None:
            if not isinstance(over, dict):
                raise ValueError(f"slurm.train.layouts.{key}.{name}: a mapping of slurm.train keys; got {over!r}")
            res.update(over)
    return res


def oom_resources(resources: dict[str, Any] | None, study: str, model: str, cfg: Any = None) -> dict[str, Any] | None:
    """The larger layout of the out-of-memory ladder's last rung: the cell's resources with
    ``layouts.on_oom`` applied; None when the profile gives none, or none with more ranks than the cell's."""
    base = train_resources(resources, study, model)
    over = _layouts(resources)[1].get("on_oom")
    if not over:
        return None
    larger = {**base, **over}
    return larger if ranks(larger, cfg) > ranks(base, cfg) else None


def _positive(res: dict[str, Any], key: str, default: int) -> int:
    value = res.get(key, default)
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"slurm.train.{key}: a positive number of {key.split('_')[0]}; got {value!r}")
    return n


def tasks_per_node(res: dict[str, Any], cfg: Any = None) -> int:
    """Ranks per node: ``tasks_per_node`` if set, else one per GPU (``gpus_per_node``), except a cell with a
    teacher / PRM on one node of 2 GPUs (one rank, the teacher on the other GPU)."""
    if "tasks_per_node" in res:
        return _positive(res, "tasks_per_node", 1)
    gpus = _positive(res, "gpus_per_node", 1)
    if cfg is not None and gpus == 2 and _positive(res, "nodes", 1) == 1:
        from lorarl.memory.ranks import has_aux

        if has_aux(cfg):
            return 1
    return gpus


def ranks(res: dict[str, Any], cfg: Any = None) -> int:
    """Ranks of the job: nodes x ranks per node."""
    return _positive(res, "nodes", 1) * tasks_per_node(res, cfg)


def job_resources(res: dict[str, Any], cfg: Any, executor: str, together: bool = True) -> dict[str, Any]:
    """The submitit parameters of one cell's training job: ``tasks_per_node`` made explicit; the local
    executor runs one node (its ``tasks_per_node`` processes on this machine). ``together``: the ranks train one
    cell, so on Slurm one rank's death ends them all (:func:`_kill_on_bad_exit`); a pack job's ranks do not."""
    out = dict(res)
    out["tasks_per_node"] = tasks_per_node(res, cfg)
    if executor != "slurm" and _positive(res, "nodes", 1) > 1:
        raise ValueError(f"slurm.train.nodes={res['nodes']}: the {executor} executor runs one node; use the slurm "
                         "executor for several nodes")
    if together and executor == "slurm" and ranks(out) > 1:
        _kill_on_bad_exit(out)
    return out


KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"


def _kill_on_bad_exit(out: dict[str, Any]) -> None:
    """srun ends every task of the job's step when one exits non-zero, so a rank that dies before the process group
    forms (where no collective timeout applies yet) or mid-step frees every node of the job at once, instead of the
    others holding their GPUs until ``LORARL_COLLECTIVE_TIMEOUT_S`` or the time limit. Added to the profile's own
    ``srun_args``, unless they already say ``--kill-on-bad-exit``/``-K``. Not for a pack job's ranks: each trains
    its own members, and a failed rank must not end the others' (their members finish and stay staged)."""
    key = "slurm_srun_args" if "slurm_srun_args" in out else "srun_args"
    args = [str(a) for a in (out.get(key) or [])]
    if not any(a == "-K" or a.startswith(("--kill-on-bad-exit", "-K")) for a in args):
        out[key] = [*args, KILL_ON_BAD_EXIT]


def pack_resources(res: dict[str, Any] | None, study: str, cfgs: list[Any], executor: str) -> dict[str, Any]:
    """The submitit parameters of a pack job: its members' training layout (they share a model), with no more
    ranks than members (each rank trains its share of the members as a pack of its own: lorarl.pack.ranks)."""
    out = job_resources(train_resources(res, study, cfgs[0].model), cfgs[0], executor, together=False)
    tasks, nodes = out["tasks_per_node"], _positive(out, "nodes", 1)
    if nodes * tasks > len(cfgs):
        nodes = -(-len(cfgs) // tasks)
        fewer = len(cfgs) if nodes == 1 else tasks
        if out.get("gpus_per_node") is not None and _positive(out, "gpus_per_node", 1) == tasks:
            out["gpus_per_node"] = fewer
        out["tasks_per_node"] = fewer
        if "nodes" in out:
            out["nodes"] = nodes
    return out


def pack_layout(res: dict[str, Any] | None, study: str, cfgs: list[Any], executor: str,
                last_attempt: bool) -> tuple[dict[str, Any], str | None]:
    """A pack job's resources, and on the out-of-memory ladder's last attempt the larger layout ``on_oom`` gives
    (more ranks: fewer members per rank) with its description; None when it has no more ranks."""
    out = pack_resources(res, study, cfgs, executor)
    big = oom_resources(res, study, cfgs[0].model, cfgs[0])
    if big is None or not last_attempt:
        return out, None
    wide = pack_resources(big, study, cfgs, executor)
    if ranks(wide) <= ranks(out):
        return out, None
    return wide, f"{ranks(wide)} ranks ({wide.get('nodes', 1)} node(s))"


def export_ranks() -> int:
    """In a submitit job of several tasks: export torch.distributed's environment for this task (its rank,
    the world size, the rendezvous on the job's first node). Returns the world size (1: nothing set)."""
    import submitit

    try:
        env = submitit.JobEnvironment()
        tasks = env.num_tasks
    except RuntimeError:  # not inside a submitit job (lorarl run, torchrun)
        return int(os.environ.get("WORLD_SIZE", "1") or 1)
    if tasks <= 1:
        return 1
    os.environ["MASTER_PORT"] = str(rendezvous_port(env.job_id))  # read by submitit's export below
    # every rank sees the node's GPUs; accelerate puts rank r on cuda:LOCAL_RANK
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return tasks


RENDEZVOUS_PORTS = (20000, 32767)  # below Linux's ephemeral ports (net.ipv4.ip_local_port_range: 32768-60999)


def rendezvous_port(job_id: str) -> int:
    """The rendezvous port of a job of several ranks: the same on every rank and after a requeue (from the job id),
    and below the ports the kernel hands to outgoing connections, so that none of those, on the job's first node,
    holds it when rank 0 listens (submitit's own pick, 20000-60000, lies mostly among them; a port in use there fails
    rank 0 at once). Any ``MASTER_PORT`` the job inherited from the submitting shell is replaced: two jobs sharing
    a first node would both take it."""
    lo, hi = RENDEZVOUS_PORTS
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    return lo + int(digits) % (hi - lo + 1)
