"""Memory plan of a study's cells (`lorarl memory`), `auto` knobs at job start, auxiliary-model placement.

    from lorarl.memory import plan_study
    plans = plan_study("experiments/peft_zoo.yaml", gpu_memory_gb=80)   # one CellPlan per cell shape
    plans[0].peak_gb, plans[0].fits, plans[0].knobs

A resident pack's plan (its largest K-member mix): :mod:`lorarl.memory.resident`. The evaluation jobs' plan (the KV
cache of the longest budget, the ``eval.batch_size`` that fits): :mod:`lorarl.memory.evaluation`.
"""

from lorarl.memory.arch import PlanError
from lorarl.memory.cells import CellPlan, plan, plan_cell, plan_study

__all__ = ["CellPlan", "PlanError", "plan", "plan_cell", "plan_study"]
