"""FSDP2 on several ranks: parameters, gradients and AdamW states sharded over the ranks (``train.sharding``).

The engine is accelerate's FSDP2 (``fully_shard`` per decoder layer, the model's ``_no_split_modules``), turned
on through the HF Trainer's ``fsdp`` arguments, as TRL documents it. ``train.sharding`` (runtime) chooses: an
adapter cell runs DDP (its trained state is small; every rank holds the frozen base) unless its replica does not
fit the job's GPU (the memory plan's ``auto``) or ``fsdp2`` is asked for: then the frozen base is sharded too.

CPU ranks (gloo, the tests): torch 2.13 runs ``fully_shard`` on a CPU device mesh, but accelerate 1.15 turns
FSDP on only for GPU-type process groups (``AcceleratorState``: ``MULTI_CPU`` never becomes ``FSDP``).
:class:`Fsdp2Sharding` switches that one flag after the Trainer built its accelerator, so CPU ranks run the same
accelerate FSDP2 code a GPU job runs (``fsdp2_prepare_model``, the sharded optimiser, the gathered state dict).
"""

from __future__ import annotations

from typing import Any

FSDP_CONFIG = {
    "version": 2,  # FSDP2: fully_shard, DTensor parameters
    "reshard_after_forward": True,  # ZeRO-3: a layer's full weights live only during its forward/backward
    "state_dict_type": "FULL_STATE_DICT",  # checkpoints and the final model gathered: the same files as 1 rank
}


def uses_fsdp(sharding: str, method: str, ranks: int) -> bool:
    """FSDP2 on several ranks: ``train.sharding`` fsdp2 (the job's memory plan resolves ``auto`` to fsdp2 or
    ddp on GPUs: lorarl.memory.auto), or ``auto`` left for the trainer (no plan ran): full fine-tuning."""
    return ranks > 1 and (sharding == "fsdp2" or (sharding == "auto" and method == "full"))


def fsdp_fields(sharding: str, method: str, ranks: int) -> dict[str, Any]:
    """The Trainer's FSDP arguments for a cell (empty: DDP or one process)."""
    return {"fsdp": True, "fsdp_config": dict(FSDP_CONFIG)} if uses_fsdp(sharding, method, ranks) else {}  # fsdp as a string: deprecated


class Fsdp2Sharding:
    """Trainer mixin: on CPU ranks, run the FSDP2 plugin the arguments ask for (see the module docstring); on
    every layout, say what each rank holds once the Trainer has sharded the policy."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        if self.args.fsdp_plugin_args is None or getattr(self, "is_fsdp_enabled", False):
            return
        from accelerate.state import AcceleratorState, PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        state = AcceleratorState()
        if state.distributed_type != DistributedType.MULTI_CPU:
            return
        state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
        state.distributed_type = DistributedType.FSDP
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState's own init does
        self.is_fsdp_enabled = True

    def _prepare_for_training(self, *args, **kwargs):
        out = super()._prepare_for_training(*args, **kwargs)
        if getattr(self, "is_fsdp_enabled", False):
            held, total = shard_sizes(self.model)
            print(f"[lorarl] rank {self.accelerator.process_index}: FSDP2 over {self.accelerator.num_processes} "
                  f"ranks: {held} of {total} parameter elements held", flush=True)
        return out


def shard_sizes(model: Any) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole model) over the model's parameters (DTensor shards)."""
    held = total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        held, total = held + local.numel(), total + p.numel()
    return held, total


def gathered_state_dict(trainer: Any) -> dict | None:
    """The full weights of an FSDP2-sharded policy, for the files one process would write (the final model,
    snapshots). Collective: every rank calls it; rank 0 gets the tensors (on the CPU), the others an empty
    dict. ``None`` when the policy is not sharded (one process or DDP: the module holds its full weights)."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return None
    state = trainer.accelerator.get_state_dict(trainer.model)
    first: dict[int, str] = {}  # tied weights (embeddings = LM head) gather as copies: alias them again, so the
    for name, p in trainer.model.named_parameters(remove_duplicate=False):  # save drops the tied key as 1 rank does
        if name in state:
            state[name] = state[first.setdefault(id(p), name)]
    return state
