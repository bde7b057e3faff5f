"""A pack member's staged outputs."""

from __future__ import annotations

import json

import pandas as pd


def staged(results, cell):
    from safetensors.torch import load_file

    d = results / "pk" / cell / ".packed"
    rows = pd.read_csv(d / "metrics.csv")
    keep = [c for c in rows.columns if not c.startswith(("time/", "pack/step_s", "tokens_per_s", "step_time"))]
    return load_file(str(d / "adapter" / "adapter_model.safetensors")), rows[keep], json.loads((d / "summary.json").read_text())
