"""``runtime.batch_invariant``: a cell's numbers independent of the batch they are computed in (docs/packed.md).

On a GPU the matrix kernels are chosen by the batch's shape (cuBLAS split-K, tile sizes), so a member of a pack,
whose rows share every forward with its pack-mates' rows, rounds differently from its solo run, and once a sampled
token flips the runs part. The mode answers that in three places:

* vLLM engines (a pack's multi-LoRA engine, the solo job's colocated one) start with vLLM's own batch-invariant
  switch, the environment variable ``VLLM_BATCH_INVARIANT=1`` (vLLM PR #30097; vLLM reads it when the engine starts:
  ``vllm.model_executor.layers.batch_invariant.init_batch_invariance``, and its C++ kernels cache it on first use,
  so the process's first engine decides them): :func:`vllm_engine_env`;
* the pack's HF rollouts and its forwards and backwards run one member at a time, each in its own batch shapes
  (those of a pack of one): :mod:`lorarl.pack.generate`, :mod:`lorarl.pack.steps`, :mod:`lorarl.pack.trainer`;
* on a CUDA device the trainer's kernels: vLLM's batch-invariant aten overrides where vLLM is installed (the same
  ``enable_batch_invariant_mode`` its engine applies; GPU only) and torch's deterministic algorithms:
  :func:`trainer_kernels`. Nothing on a CPU, whose kernels do not depend on the batch's shape here
  (tests/pack/test_solo_pack.py).

Not yet run on a GPU (bench/results: none); ``python -m lorarl.gpucheck`` measures it where one is lent.
"""

from __future__ import annotations

import os
import sys

VLLM_FLAG = "VLLM_BATCH_INVARIANT"  # vLLM's own switch (vllm/envs.py), read by the engine at its start
_APPLIED: list[str] = []  # what trainer_kernels applied in this process (process-wide and for good: once)


def vllm_on() -> bool:
    """Whether an engine built now in this process starts batch-invariant (vLLM's rule: an int, not 0)."""
    try:
        return int(os.environ.get(VLLM_FLAG, "0")) != 0
    except ValueError:
        return False


def vllm_engine_env(on: bool) -> None:
    """Before a vLLM engine is built in this process: vLLM's batch-invariant switch on when ``on`` (left as it is
    otherwise: a user's own setting stands). The engine is in-process (``external_launcher``), so the switch is this
    process's environment, where vLLM reads it, and stays on for the engine's life."""
    if on:
        os.environ[VLLM_FLAG] = "1"


def trainer_kernels(on: bool, device_type: str) -> list[str]:
    """On a CUDA device, the trainer's batch-invariant kernels (what is applied, printed once): vLLM's aten overrides
    (mm/addmm/matmul/linear on Ampere, cuBLAS without split-K on Hopper and later, log_softmax/softmax/mean/bmm as
    Triton kernels) where vLLM imports, and torch's deterministic algorithms. Nothing elsewhere (a CPU's kernels
    here do not depend on the batch's shape) or when off."""
    if not on or device_type != "cuda":
        return []
    if _APPLIED:
        return list(_APPLIED)
    import torch

    done = _APPLIED
    try:
        from vllm.model_executor.layers import batch_invariant as vbi  # GPU extra only

        vllm_engine_env(True)  # init_batch_invariance applies them only when the switch is on
        init = getattr(vbi, "init_batch_invariance", None) or vbi.enable_batch_invariant_mode
        init()
        done.append("vLLM's batch-invariant kernels")
    except ImportError as err:
        done.append(f"no vLLM batch-invariant kernels ({err})")
    torch.use_deterministic_algorithms(True, warn_only=True)
    done.append("torch deterministic algorithms")
    print(f"[lorarl] runtime.batch_invariant: {'; '.join(done)}", file=sys.stderr, flush=True)
    return list(done)
