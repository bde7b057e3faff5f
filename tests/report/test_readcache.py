"""lorarl.report.readcache: a per-cell table is parsed once per content; a rewritten file is parsed again."""

from __future__ import annotations

import pandas as pd

from lorarl.report import readcache


def test_same_content_is_parsed_once_and_a_rewrite_is_seen(tmp_path):
    f = tmp_path / "metrics.csv"
    pd.DataFrame({"step": [1, 2], "reward": [0.1, 0.2]}).to_csv(f, index=False)
    a = readcache.read_csv(f)
    assert readcache.read_csv(f) is a and a["reward"].tolist() == [0.1, 0.2]
    pd.DataFrame({"step": [1, 2], "reward": [0.3, 0.4]}).to_csv(f, index=False)  # same size, same instant
    assert readcache.read_csv(f)["reward"].tolist() == [0.3, 0.4]
    p = tmp_path / "d.parquet"
    pd.DataFrame({"metric": ["x"], "value": [1.0]}).to_parquet(p, index=False)
    assert readcache.read_parquet(p) is readcache.read_parquet(p)
    assert readcache.read_parquet(p)["value"].tolist() == [1.0]
