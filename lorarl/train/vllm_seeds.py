"""vLLM rollouts that do not depend on the number of ranks: one seed per generation row.

TRL's colocated engines (one per rank, or per tensor-parallel group) sample every prompt of a ``generate`` call
from the engine's own random stream, seeded per rank: the rollouts of a cell then depend on how many ranks share
the batch. Here each row gets its own vLLM request seed (``SamplingParams.seed``: a generator per request),
from the cell's seed, the training step, the generation call within that step (DAPO refill rounds) and the
row's index in the whole generation batch, so row ``i`` samples the same tokens on 1 rank or on N, and after a
resume. Rank ``r`` of a tensor-parallel group of ``tp`` ranks generates the ``tp`` ranks' rows of its group
(TRL gathers them), whose first global row is ``(r // tp) * len(rows)``.
"""

from __future__ import annotations

import hashlib
from typing import Any


def row_seed(seed: int, step: int, call: int, row: int) -> int:
    """A 56-bit request seed for one generation row (distinct inputs give unrelated seeds)."""
    key = f"{int(seed)}:{int(step)}:{int(call)}:{int(row)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "big")


class RowSeeds:
    """Wraps an engine's ``generate``: one ``SamplingParams`` per row, each with its row's seed."""

    def __init__(self, generate: Any, trainer: Any, tensor_parallel_size: int = 1):
        self.generate, self.trainer, self.tp = generate, trainer, max(1, int(tensor_parallel_size))
        self.step, self.call = None, 0

    def __call__(self, prompts: Any, sampling_params: Any = None, **kwargs: Any) -> Any:
        if sampling_params is None or isinstance(sampling_params, list) or not isinstance(prompts, list):
            return self.generate(prompts, sampling_params=sampling_params, **kwargs)
        step = int(self.trainer.state.global_step)
        self.call = self.call + 1 if step == self.step else 0
        self.step = step
        first = (self.trainer.accelerator.process_index // self.tp) * len(prompts)
        seed = int(self.trainer.args.seed)
        params = []
        for i in range(len(prompts)):
            p = sampling_params.clone()
            p.seed = row_seed(seed, step, self.call, first + i)
            params.append(p)
        return self.generate(prompts, sampling_params=params, **kwargs)


def seed_rows(trainer: Any) -> None:
    """Give the trainer's colocated engine per-row seeds (call once, after TRL built it)."""
    gen = trainer.vllm_generation
    gen.llm.generate = RowSeeds(gen.llm.generate, trainer, getattr(gen, "tensor_parallel_size", 1))


__all__ = ["RowSeeds", "row_seed", "seed_rows"]
