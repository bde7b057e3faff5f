"""Per-cell tables read once per process: the aggregate stage reads every cell's metrics.csv and
diagnostics.parquet for its tables and again for the report; this keeps the parsed frame.

Keyed by the file's path and the SHA-1 of its bytes (not its mtime: two quick rewrites can share an
mtime tick), so a changed file is parsed again. Callers must not mutate the returned frame (use
`.assign`, which copies).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pandas as pd

_FRAMES: dict[tuple[str, str, str], pd.DataFrame] = {}  # (kind, path, sha1) -> parsed frame
_READERS = {"csv": pd.read_csv, "parquet": pd.read_parquet}


def _read(kind: str, path: str | Path) -> pd.DataFrame:
    blob = Path(path).read_bytes()
    key = (kind, str(path), hashlib.sha1(blob).hexdigest())
    if key not in _FRAMES:
        _FRAMES[key] = _READERS[kind](io.BytesIO(blob))
    return _FRAMES[key]


def read_csv(path: str | Path) -> pd.DataFrame:
    """`pd.read_csv(path)`, parsed once per content."""
    return _read("csv", path)


def read_parquet(path: str | Path) -> pd.DataFrame:
    """`pd.read_parquet(path)`, parsed once per content."""
    return _read("parquet", path)
