"""Packed cells: K cells that share one frozen base train in one batched forward (issue 14).

* :mod:`lorarl.pack.routing`: routes each row of a batch through its own cell's LoRA layers.
* :mod:`lorarl.pack.loss`: one cell's GRPO loss + KL term, equal to the solo trainer's.
* :mod:`lorarl.pack.trainer`: per-cell optimiser, scheduler, clipping and divergence stop.
"""
