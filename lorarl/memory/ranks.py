"""The training layout of a cell: how many ranks, DDP or FSDP2, each rank's share (the smallest layout that
fits: lorarl.memory.layout).

A training job of ``nodes`` x ``gpus_per_node`` GPUs (the profile's ``slurm.train`` resources) trains on
``W = nodes x gpus_per_node`` ranks, one process per GPU, with one exception kept from the one-GPU design: a
cell with a teacher / HF PRM (:func:`has_aux`) on one node of 2 GPUs trains on one rank and puts the
teacher / PRM on the second GPU (lorarl.memory.auto.place_aux; paper 001's teacher on a separate GPU). In
every other layout each rank holds its own teacher / PRM beside its policy and scores its own rows.

The global batch (``prompts_per_step x generations`` sequences per rollout, that / ``updates_per_generation``
per optimiser update) is split over the ranks: each rank generates and updates on its share
(``ceil(rows / W)``; :func:`smallest_layout` keeps only layouts that split it evenly); its micro-batch and
generation chunk are per rank.

Strategy (:func:`strategy_for`, what the trainer is meant to pick): one rank: ``single``; full fine-tuning:
``fsdp2``; an adapter cell: ``ddp`` (every rank a replica of the frozen base, the adapter and its optimiser
state; gradients all-reduced) unless what a replica holds for the whole job (weights, trainable state, KL
reference, teacher/PRM, vLLM share) exceeds the budget, then ``fsdp2`` (parameters, gradients and AdamW
states sharded by ``W``; lorarl.memory.plan.static_parts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lorarl.memory.arch import PlanError

STRATEGIES = ("single", "ddp", "fsdp2")


@dataclass(frozen=True)
class Layout:
    """A training job's GPUs: ``nodes`` nodes of ``gpus_per_node`` GPUs each."""

    gpus_per_node: int = 1
    nodes: int = 1

    def __post_init__(self) -> None:
        for name, v in (("gpus_per_node", self.gpus_per_node), ("nodes", self.nodes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanError(f"layout {name} must be a whole number >= 1; got {v!r}")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def ranks(self, aux: bool) -> int:
        """Training ranks of a cell on this layout (``aux``: the cell has a teacher / HF PRM)."""
        if aux and self.nodes == 1 and self.gpus_per_node == 2:
            return 1  # the policy on the first GPU, the teacher / PRM on the second
        return self.gpus

    def __str__(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s)"


def has_aux(cfg: Any) -> bool:
    """The cell's regime loads a model beside the policy (a distillation teacher, an HF process-reward model)."""
    from lorarl.rewards.registry import extra_models

    return bool(extra_models(cfg.reward))


def share(total: int, ranks: int) -> int:
    """One rank's share of ``total`` sequences (the largest share when they do not split evenly)."""
    return math.ceil(total / ranks)


def strategy_for(method: str, ranks: int, replica_bytes: float, budget_bytes: float, sharding: str = "auto") -> str:
    """single | ddp | fsdp2 for ``ranks`` ranks (see the module docstring); ``replica_bytes``: what a DDP
    replica holds for the whole job (lorarl.memory.plan.static_parts at world 1). ``sharding``: the cell's
    ``train.sharding`` (ddp / fsdp2 as set; auto: FSDP2 for full fine-tuning or a replica over the budget). The
    job's plan resolves ``auto`` to this (lorarl.memory.auto.resolve_job), so the trainer runs what is planned."""
    if ranks <= 1:
        return "single"
    if sharding in ("ddp", "fsdp2"):
        return sharding
    if method == "full" or replica_bytes > budget_bytes:
        return "fsdp2"
    return "ddp"


def layouts(gpus_per_node: int, max_nodes: int) -> list[Layout]:
    """Candidate layouts, fewest GPUs first: 1..gpus_per_node GPUs on one node, then whole nodes."""
    Layout(gpus_per_node, max_nodes)  # validates both
    return [Layout(g, 1) for g in range(1, gpus_per_node + 1)] + [Layout(gpus_per_node, n)
                                                                 for n in range(2, max_nodes + 1)]
