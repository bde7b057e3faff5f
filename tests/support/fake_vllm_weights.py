"""tests/support/fake_vllm.py's weight paths: ``model_runner.model.load_weights`` (TRL's colocated sync; vLLM's CPU build
cannot reach its repacked linear layers through it) and ``model_runner.reload_weights`` (the layerwise reload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class Runner:
    """``model_runner.model``: the engine's weights, loaded by name like vLLM's ``load_weights``."""

    def __init__(self, llm: Any):
        self.llm = llm

    def load_weights(self, weights) -> set[str]:
        params = dict(self.llm.hf_model.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:
                raise KeyError(name)  # vLLM: params_dict[name] for a name the model does not have
            if self.llm.cpu_build and name.endswith("_proj.weight"):  # repacked linear: no loader left
                raise AttributeError("'Parameter' object has no attribute 'weight_loader'")
            if tuple(params[name].shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {tuple(params[name].shape)}")
            self.llm.loaded.append(name)
            loaded.add(name)
            if not self.llm.stale:
                with torch.no_grad():
                    params[name].copy_(tensor.to(params[name].dtype))
        self.llm.load_calls += 1
        return loaded


def reload_weights(llm: Any, weights_iterator=None, weights_path: str | None = None,
                   is_checkpoint_format: bool = True) -> None:
    """``model_runner.reload_weights``: vLLM's layerwise reload (load_weights between ``initialize_`` and
    ``finalize_layerwise_reload``, which re-runs the post-load processing: the CPU build's repacking too)."""
    if weights_iterator is None:
        from safetensors.torch import load_file

        folder = Path(weights_path or llm.kwargs["model"])
        weights_iterator = (kv for f in sorted(folder.glob("*.safetensors")) for kv in load_file(str(f)).items())
    cpu_build, llm.cpu_build = llm.cpu_build, False
    try:
        Runner(llm).load_weights(weights_iterator)
    finally:
        llm.cpu_build = cpu_build
