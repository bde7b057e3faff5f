"""The memory plan of a resident pack (lorarl.pack.resident): its peak is the largest K-member mix it may admit.

    most, peak_gb = admitted_places(cfgs, gpu_memory_gb=80, places=4)

Members share the frozen base (weights, the reference, teacher / PRM, a vLLM engine: the largest member's, once);
each member adds its trainable state (adapter, gradients, AdamW moments) and its share of the step's worst phase
(the pack's update and rollout take every member's rows at once). A job with K places may admit any K cells of
its group, so its peak is the shared part plus the K largest members' own parts (lorarl.memory.cells.plan_cell
per member, at the member's own knobs), checked against ``HEADROOM`` of the GPU.
"""

from __future__ import annotations

from typing import Any

from lorarl.memory.cells import plan_cell, shape_key
from lorarl.memory.plan import HEADROOM

OWN = ("trainable_state",)  # parts of a member's plan that each member holds for itself
PHASES = ("phase_update", "phase_rollout", "phase_scoring")  # a step's phases (each member adds its rows)


def member_parts(cfg: Any, gpu_memory_gb: float) -> tuple[float, float]:
    """(shared GiB, the member's own GiB) of one cell config."""
    parts = plan_cell(cfg, gpu_memory_gb=gpu_memory_gb).parts_gb
    own = sum(parts.get(k, 0.0) for k in OWN) + max(parts.get(k, 0.0) for k in PHASES)
    shared = sum(v for k, v in parts.items() if k not in OWN and k not in PHASES and k not in ("static", "peak"))
    return shared, own


def mix_peak_gb(cfgs: list[Any], k: int, gpu_memory_gb: float) -> float:
    """The peak of the largest ``k``-member mix of these cells (GiB)."""
    seen: dict[str, tuple[float, float]] = {}
    each = []
    for cfg in cfgs:
        key = shape_key(cfg)
        if key not in seen:
            seen[key] = member_parts(cfg, gpu_memory_gb)
        each.append(seen[key])
    shared = max(s for s, _ in each)
    return shared + sum(sorted((o for _, o in each), reverse=True)[:k])


def admitted_places(cfgs: list[Any], gpu_memory_gb: float, places: int) -> tuple[int, float]:
    """(the most places the plan admits on this GPU, the peak at ``places``). A group smaller than the places
    never holds more than its members: any number of places from there on is admitted."""
    budget = HEADROOM * gpu_memory_gb
    n = len(cfgs)
    peak = mix_peak_gb(cfgs, min(places, n), gpu_memory_gb)
    most = 0
    for k in range(1, n + 1):
        if mix_peak_gb(cfgs, k, gpu_memory_gb) > budget:
            break
        most = k
    if most == n:
        most = max(places, n)
    return most, peak
