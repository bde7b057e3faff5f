"""The smallest training layout that fits a cell or a study (fewest GPUs), for the launch side:

    from lorarl.memory.layout import smallest_layout
    p = smallest_layout(cfg, gpu_memory_gb=80, gpus_per_node=8, max_nodes=4)   # a CellPlan, or None
    p.gpus, p.nodes, p.ranks, p.strategy, p.micro_batch, p.peak_gb

Layouts, ranks and strategy: lorarl.memory.ranks (re-exported here).
"""

from __future__ import annotations

from typing import Any

from lorarl.memory.cells import CellPlan, plan_cell, plan_study
from lorarl.memory.ranks import STRATEGIES, Layout, has_aux, layouts, share, strategy_for

__all__ = ["STRATEGIES", "Layout", "has_aux", "layouts", "share", "smallest_layout", "smallest_study_layout",
           "strategy_for"]


def _even(cfg: Any, layout: Layout) -> bool:
    t = cfg.train
    rows = t.prompts_per_step * t.generations // t.updates_per_generation
    return rows % layout.ranks(has_aux(cfg)) == 0


def smallest_layout(cfg: Any, gpu_memory_gb: float, gpus_per_node: int = 8, max_nodes: int = 4,
                    results_dir: str = "results") -> CellPlan | None:
    """The plan (lorarl.memory.cells.CellPlan, with its ``gpus``, ``nodes``, ``ranks``, ``strategy``) of the
    fewest GPUs of ``gpu_memory_gb`` GiB on which the cell ``cfg`` fits with its own settings, each rank an
    equal share of the update's rows; None when no layout up to ``max_nodes`` nodes fits."""
    for lay in layouts(gpus_per_node, max_nodes):
        if not _even(cfg, lay):
            continue
        p = plan_cell(cfg, gpu_memory_gb, gpus=lay.gpus_per_node, nodes=lay.nodes, results_dir=results_dir)
        if p.fits:
            return p
    return None


def smallest_study_layout(study: str, gpu_memory_gb: float, gpus_per_node: int = 8, max_nodes: int = 4,
                          results_dir: str = "results") -> tuple[Layout, list[CellPlan]] | None:
    """The fewest GPUs on which every cell shape of the study fits (one layout for the whole study), with
    the plans; None when none up to ``max_nodes`` nodes does."""
    from lorarl.language.study import load_study, study_cells

    st = load_study(study)
    if st.kind != "grpo":
        return Layout(), []
    cfgs = [c.config for c in study_cells(st)]
    for lay in layouts(gpus_per_node, max_nodes):
        if not all(_even(c, lay) for c in cfgs):
            continue
        plans = plan_study(study, gpu_memory_gb, lay.gpus_per_node, results_dir=results_dir, nodes=lay.nodes)
        if all(p.fits for p in plans):
            return lay, plans
    return None
