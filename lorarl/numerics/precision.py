"""Training numerics (``train.precision``): which dtype the weights are loaded in, which dtype the
trainable tensors (and so the optimiser state) live in, and whether the forward runs under autocast.

* ``fp32``: everything float32 (the CPU default).
* ``bf16-mixed`` (the GPU default): fp32 master weights and optimiser state for every trainable
  tensor (full fine-tuning: the whole model; PEFT: the adapter's tensors), bf16 compute through
  autocast (the trainer's ``bf16=True``); a frozen PEFT base stays bf16 (it is never updated).
* ``bf16-pure``: weights, trainable tensors and optimiser state all bf16, no autocast. An update
  smaller than half a bf16 ulp of its weight (~0.4% relative) is rounded away every step: the
  effect paper 004 §2.3 is about. Only when a study asks for it.

Pure functions of the setting plus one in-place cast; torch is imported lazily.
"""

from __future__ import annotations

from typing import Any

PRECISIONS = ("bf16-mixed", "fp32", "bf16-pure")


def resolve_precision(setting: str | None, device: str) -> str:
    """``train.precision`` with null resolved for the device (cuda: bf16-mixed, else fp32)."""
    if setting is None:
        return "bf16-mixed" if str(device).startswith("cuda") else "fp32"
    if setting not in PRECISIONS:
        raise ValueError(f"train.precision {setting!r}; allowed: {', '.join(PRECISIONS)}")
    return setting


def load_dtype(precision: str, method: str) -> str:
    """dtype the base weights are loaded in: fp32 unless the weights that stay frozen may be bf16."""
    if precision == "fp32":
        return "float32"
    if precision == "bf16-pure":
        return "bfloat16"
    return "float32" if method == "full" else "bfloat16"  # full FT: every weight is a master weight


def autocast_bf16(precision: str) -> bool:
    """Whether the trainer runs the forward/backward under bf16 autocast (TrainingArguments.bf16)."""
    return precision == "bf16-mixed"


def cast_trainable(model: Any, precision: str) -> dict[str, int]:
    """Put every trainable tensor in its master dtype (fp32, or bf16 for bf16-pure) in place, before
    the optimiser is built (its state follows the parameter dtype). Returns {dtype name: tensors}."""
    import torch

    want = torch.bfloat16 if precision == "bf16-pure" else torch.float32
    counts: dict[str, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            if p.dtype != want:
                p.data = p.data.to(want)
            counts[str(want).removeprefix("torch.")] = counts.get(str(want).removeprefix("torch."), 0) + 1
    return counts


def trainable_dtypes(model: Any) -> dict[str, int]:
    """{dtype name: number of trainable tensors} (what was actually trained; logged in the summary)."""
    counts: dict[str, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            k = str(p.dtype).removeprefix("torch.")
            counts[k] = counts.get(k, 0) + 1
    return counts
