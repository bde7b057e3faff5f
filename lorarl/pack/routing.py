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

Grouped adapter terms (``grouped``; default: on a GPU). One cell at a time, a layer's adapter terms cost K pairs
of small matmuls and their Python calls per forward; profiled on an H200 (a 1024-wide, 8-layer model, K = 4), those
calls were 43% of a pack step's time, on the host. Grouped, the plain LoRA cells of a layer (no variant, no
dropout, no LoRA bias; one active adapter) that share a rank and a row count take their terms in two batched
matmuls (``torch.bmm`` over the cells' stacked ``lora_A`` / ``lora_B`` weights, then each cell's scaling); a cell
of another rank or row count takes the same batched matmul alone. Every cell's rows go through the same
arithmetic in a pack of K and in a pack of one, so the packs' bit-for-bit contract holds grouped too
(tests/pack/test_pack_grouped.py); against one cell at a time (PEFT's own ``F.linear``) the rounding differs (1e-7).
``$LORARL_PACK_GROUPED`` = 1 or 0 overrides the default.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch

GROUPED_ENV = "LORARL_PACK_GROUPED"  # 1: grouped adapter terms, 0: one cell at a time; unset: grouped on a GPU


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


def _plain(layer: Any) -> str | None:
    """The layer's one active adapter when its term is plain LoRA (``B(A(x)) * scaling``: no variant, no dropout,
    no LoRA bias), else None (its term goes through :func:`_adapter_term`)."""
    names = [n for n in layer.active_adapters if n in layer.lora_A]
    if len(names) != 1:
        return None
    n = names[0]
    if n in layer.lora_variant or not isinstance(layer.lora_dropout[n], torch.nn.Identity):
        return None
    if layer.lora_A[n].bias is not None or layer.lora_B[n].bias is not None:
        return None
    return n


def grouped_terms(layers: list[Any], x: torch.Tensor, base: torch.Tensor, sizes: list[int],
                  scales: dict | None = None) -> torch.Tensor:
    """``base`` plus each cell's adapter term on its rows (row block k: ``sizes[k]`` rows through ``layers[k]``), the
    plain LoRA cells of one rank, row count and dtype in one pair of batched matmuls, the others one at a time.
    ``scales``: a cache of the groups' scaling tensors (one host-to-device copy per group, not per forward)."""
    dtype = base.dtype
    spans, start = [], 0
    for n in sizes:
        spans.append(slice(start, start + n))
        start += n
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for k, (layer, n) in enumerate(zip(layers, sizes)):
        name = _plain(layer) if n else None
        if name is None:
            continue
        w = layer.lora_A[name].weight
        groups.setdefault((w.shape[0], n, w.dtype, layer.lora_B[name].weight.dtype), []).append((k, name))
    whole = len(groups) == 1 and all(sizes) and len(next(iter(groups.values()))) == len(layers)
    terms: dict[int, torch.Tensor] = {}
    for members in groups.values():
        first = layers[members[0][0]]
        a_GRD = torch.stack([layers[k].lora_A[nm].weight for k, nm in members])
        b_GOR = torch.stack([layers[k].lora_B[nm].weight for k, nm in members])
        # every cell in this group (the usual pack): its rows are the batch's, in order, no copy
        x_GN_D = x.reshape(len(members), *x[spans[0]].shape) if whole else torch.stack([x[spans[k]] for k, _ in members])
        x_GN_D = first._cast_input_dtype(x_GN_D, a_GRD.dtype)
        lead = x_GN_D.shape[1:-1]  # a cell's rows (and sequence positions)
        x_GMD = x_GN_D.reshape(len(members), -1, x_GN_D.shape[-1])
        y_GMO = torch.bmm(torch.bmm(x_GMD, a_GRD.transpose(1, 2)), b_GOR.transpose(1, 2))
        y_GMO = y_GMO * _scale_of(layers, members, y_GMO, scales)[:, None, None]
        y_GN_O = y_GMO.reshape(len(members), *lead, y_GMO.shape[-1])
        if whole:
            return (base + y_GN_O.reshape(base.shape)).to(dtype)
        for i, (k, _) in enumerate(members):
            terms[k] = (base[spans[k]] + y_GN_O[i]).to(dtype)
    parts = [terms[k] if k in terms else _adapter_term(layer, x[spans[k]], base[spans[k]])
             for k, layer in enumerate(layers)]
    return torch.cat(parts, dim=0)


def _scale_of(layers: list[Any], members: list[tuple[int, str]], like: torch.Tensor, cache: dict | None) -> torch.Tensor:
    """The members' scalings as a tensor on ``like``'s device and dtype (cached by the scalings' values)."""
    values = tuple(float(layers[k].scaling[nm]) for k, nm in members)
    key = (values, like.dtype, like.device)
    if cache is not None and key in cache:
        return cache[key]
    t = torch.tensor(values, dtype=like.dtype, device=like.device)
    if cache is not None:
        cache[key] = t
    return t


def grouped_default(device: torch.device | str | None) -> bool:
    """``$LORARL_PACK_GROUPED`` (1/0) if set, else grouped on a GPU (where the per-cell calls bind the host)."""
    value = os.environ.get(GROUPED_ENV, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise ValueError(f"{GROUPED_ENV} must be 1 or 0 (or unset: grouped on a GPU); got {value!r}")
    return torch.device(device).type == "cuda" if device is not None else False


class Router:
    """Routes the rows of a batched forward of ``models[0]`` to the K cells' LoRA layers."""

    def __init__(self, models: list[torch.nn.Module], grouped: bool | None = None):
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
        self.grouped = grouped_default(next(self.host.parameters()).device) if grouped is None else bool(grouped)
        self._scales: dict = {}  # the grouped path's scaling tensors, by value (lorarl.pack.routing.grouped_terms)
        for n, layer in host_layers.items():
            layer.forward = self._make_forward(n, layer)

    def _make_forward(self, name: str, host_layer: Any):
        original = type(host_layer).forward

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if self._sizes is None:  # not routing: the host behaves as cell 0's plain model
                return original(host_layer, x, *args, **kwargs)
            base = host_layer.get_base_layer()(x, *args, **kwargs)  # the shared frozen base, whole batch
            if self.grouped:
                return grouped_terms(self.layers[name], x, base, self._sizes, self._scales)
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
