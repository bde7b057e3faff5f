"""The multi-rank comparison: a cell's weights and the check that two runs trained the same cell."""

from __future__ import annotations

from pathlib import Path


STEPS = 2


SAME = ["loss", "grad_norm", "reward", "reward_std", "kl", "kl_ref/k3", "kl_ref/k1", "kl_new_old", "kl_new_old/update",
        "adv/std", "adv/abs_max", "deposits/mean", "deposits/per_completion", "frac_truncated", "rollout/tokens",
        "num_tokens", "learning_rate"]


def weights(cell: Path, adapter: bool = True) -> dict:
    from safetensors.torch import load_file

    folder = cell / "adapter" if adapter else cell
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def assert_same_cell(one: Path, two: Path, start: dict) -> None:
    """Same metrics step by step, same final weights; ``start``: the base weights (full fine-tuning), or
    empty for LoRA (its B starts at 0): the weights moved, so the comparison can fail."""
    import json

    import pandas as pd
    import torch

    a, b = pd.read_csv(one / "metrics.csv"), pd.read_csv(two / "metrics.csv")
    assert a["step"].tolist() == b["step"].tolist() == list(range(1, STEPS + 1))
    for key in SAME:
        assert key in a and key in b, key
        assert (a[key] - b[key]).abs().max() <= 1e-5 * max(1.0, a[key].abs().max()), (key, a[key].tolist(),
                                                                                       b[key].tolist())
    assert json.loads((two / "summary.json").read_text())["steps"] == STEPS
    x, y = weights(one), weights(two)
    assert x.keys() == y.keys()
    moved = [x[k] - start[k] for k in x if k in start] if start else [x[k] for k in x if "lora_B" in k]  # B0 = 0
    assert moved and max(float(d.abs().max()) for d in moved) > 1e-5  # it did learn
    for k in x:
        torch.testing.assert_close(y[k], x[k], rtol=1e-5, atol=1e-5)
