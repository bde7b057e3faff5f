"""Which columns of a cell table are evaluation values, and each benchmark's headline column."""

from __future__ import annotations

import re

import pandas as pd

EVAL_COL = re.compile(r"^[A-Za-z0-9_]+/(pass|avg)@\d+$")  # `<benchmark>/<metric>` value columns


def eval_metrics(df: pd.DataFrame) -> list[str]:
    """The evaluation value columns of a table, in column order."""
    return [c for c in df.columns if EVAL_COL.match(str(c))]


def primary_columns(df: pd.DataFrame) -> list[str]:
    """Each benchmark's headline column (its first metric: pass@1, or avg@n for sampled protocols)."""
    first: dict[str, str] = {}
    for c in eval_metrics(df):
        first.setdefault(c.split("/")[0], c)
    return list(first.values())
