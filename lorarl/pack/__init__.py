"""Packed cells: K cells that share one frozen base train in one job (issue 14).

* :mod:`lorarl.pack.plan`: which cells may share a pack (compatibility key) and the grouping.
* :mod:`lorarl.pack.hosting`: the hosting plan: who trains each unfinished cell (solo, a pack, a resident job) and
  to which step; workflow/rules/pack.smk, the doctor and the train stage read it.
* :mod:`lorarl.pack.routing`: routes each row of a batch through its own cell's LoRA layers.
* :mod:`lorarl.pack.generate`: batched rollouts, each cell sampling from its own generator.
* :mod:`lorarl.pack.loss`: one cell's GRPO loss + KL term, equal to the solo trainer's.
* :mod:`lorarl.pack.trainer`: per-cell optimiser, scheduler, clipping and divergence stop.
* :mod:`lorarl.pack.steps`: full steps (data order, rollouts, regime scoring, advantages, KL, update).
* :mod:`lorarl.pack.build`: cells → a pack (one base, K adapters, shared frozen weights).
* :mod:`lorarl.pack.run`: the pack job (per-member MLflow run, metrics, checkpoints, staged outputs).
* :mod:`lorarl.pack.publish`: the hand-over to each member's own ``train`` job.
* :mod:`lorarl.pack.resident`: resident packs (K places; a freed place takes the next waiting cell).
* :mod:`lorarl.pack.multilora`: vLLM multi-LoRA request building (GPU only; tested with the fake).
"""
