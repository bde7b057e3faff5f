"""Row routing over LoRA layers: one batched forward, each row through its own cell's adapter.

K cells are K PEFT models built from the same base weights (``lorarl.adapters.build_adapter`` or
TRL/PEFT's own wrapping). :class:`Router` keeps the FIRST cell's model as the host: every LoRA layer of
the host gets a routed ``forward`` that runs the shared frozen base layer once over the whole batch,
then adds each cell's adapter term to that cell's rows, with the cell's own LoRA layer and exactly
PEFT's own arithmetic (``lora_B(lora_A(dropout(x))) * scaling``, or the variant's ``forward`` for DoRA
and the other variants). The other cells' models donate only their adapter modules; their base layers
are never called. The cells' rows are contiguous, in cell order (``Router.route(sizes)``).

Why not PEFT's ``adapter_names`` mixed batch: it refuses training mode, and several adapters of one
PEFT model share one ``active_adapter`` bookkeeping that saving and the optimisers of this project do
not expect. Here each cell keeps its own, ordinary PEFT model (its own save, optimiser, checkpoint).

Requirement (checked): every cell's frozen base weight equals the host's, bit for bit. Residual inits
(PiSSA, ...) rewrite the base, so such cells pack only when their residual bases are identical.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """Name → PEFT LoRA layer (the modules whose forward is routed)."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def _adapter_term(layer: Any, x: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``result`` (the base layer's output for these rows) plus ``layer``'s adapter term: PEFT's
    ``lora.Linear.forward`` after its ``self.base_layer(x)`` line, for the layer's active adapters."""
    dtype = result.dtype
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        lora_A, lora_B = layer.lora_A[name], layer.lora_B[name]
        x = layer._cast_input_dtype(x, lora_A.weight.dtype)
        if name not in layer.lora_variant:
            result = result + lora_B(lora_A(layer.lora_dropout[name](x))) * layer.scaling[name]
        else:
            result = layer.lora_variant[name].forward(layer, active_adapter=name, x=x, result=result)
    return result.to(dtype)


class Router:
    """Routes the rows of a batched forward of ``models[0]`` to the K cells' LoRA layers."""

    def __init__(self, models: list[torch.nn.Module]):
        if not models:
            raise ValueError("a pack needs at least one cell model")
        self.models = models
        self.host = models[0]
        host_layers = lora_layers(self.host)
        if not host_layers:
            raise ValueError("the pack's models have no LoRA layers to route (packing supports the LoRA family)")
        self.layers: dict[str, list[Any]] = {}
        for k, m in enumerate(models):
            mine = lora_layers(m)
            if mine.keys() != host_layers.keys():
                raise ValueError(f"cell {k}: adapted modules differ from cell 0's; cells of a pack need the same "
                                 "target modules")
            for n, layer in mine.items():
                hb, cb = host_layers[n].get_base_layer(), layer.get_base_layer()
                if k and not (hb.weight.shape == cb.weight.shape and torch.equal(hb.weight, cb.weight)):
                    raise ValueError(f"cell {k}: frozen base weight of {n} differs from cell 0's (residual init?); "
                                     "cells of a pack must share their base bit for bit")
                self.layers.setdefault(n, []).append(layer)
        self._sizes: list[int] | None = None
        self._saved: dict[str, Any] = {}
        for n, layer in host_layers.items():
            layer.forward = self._make_forward(n, layer)

    def _make_forward(self, name: str, host_layer: Any):
        original = type(host_layer).forward

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self._sizes is None:  # not routing: the host behaves as cell 0's plain model
                return original(host_layer, x, *args, **kwargs)
            base = host_layer.get_base_layer()(x, *args, **kwargs)  # the shared frozen base, whole batch
            parts, start = [], 0
            for layer, n in zip(self.layers[name], self._sizes):
                sl = slice(start, start + n)
                parts.append(_adapter_term(layer, x[sl], base[sl]))
                start += n
            return torch.cat(parts, dim=0)

        return forward

    @contextlib.contextmanager
    def route(self, sizes: list[int]) -> Iterator[None]:
        """Inside: row block ``k`` (``sizes[k]`` rows, in order) of the host's input uses cell ``k``."""
        if len(sizes) != len(self.models):
            raise ValueError(f"route got {len(sizes)} row counts for {len(self.models)} cells")
        prev, self._sizes = self._sizes, list(sizes)
        try:
            yield
        finally:
            self._sizes = prev

    def remove(self) -> None:
        """Give the host model its own forward back."""
        for layers in self.layers.values():
            layers[0].__dict__.pop("forward", None)
