"""`eval.benchmarks.<b>.headline` names the metric of a benchmark's headline column (paper 003 Table 1 and
App. C.2: pass@4 for MATH500, pass@32 for the AIME columns, averaged into Avg): the stats table, the Avg
table and the figures read it; it is checked against the protocol's metrics; it changes no signature (the
metric is computed anyway, nothing is re-evaluated)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lorarl.language.config import CellConfig
from lorarl.report.columns import headlines, primary_columns
from lorarl.language.signature import eval_settings_signature, train_signature
from lorarl.language.study import load_study

ROOT = Path(__file__).resolve().parents[2]


def _cfg(**aime) -> CellConfig:
    return CellConfig.model_validate({"model": "local:tiny-arith", "eval": {"benchmarks": {
        "gsm8k": {}, "aime24": {"protocol": {"n": 8, "temperature": 0.6}, **aime}}}})


def test_paper_003_studies_name_pass_at_k_headlines():
    assert headlines(load_study(str(ROOT / "experiments" / "init_geometry.yaml"))) == {
        "math500": "pass@4", "aime22": "pass@32", "aime23": "pass@32", "aime24": "pass@32"}
    assert headlines(load_study(str(ROOT / "experiments" / "init_geometry_7b.yaml")))["aime24"] == "pass@16"
    assert headlines(load_study(str(ROOT / "experiments" / "peft_zoo.yaml"))) == {}  # default unchanged
    assert headlines(load_study(str(ROOT / "experiments" / "kl_bound_toy.yaml"))) == {}  # no evaluation at all


def test_headline_must_be_a_metric_of_the_protocol():
    assert _cfg(headline="pass@8").eval.benchmarks["aime24"].headline == "pass@8"
    with pytest.raises(ValueError, match=r"eval.benchmarks.aime24.headline: 'pass@32' is not a metric of its "
                                         r"protocol; allowed: avg@8, pass@8"):
        _cfg(headline="pass@32")


def test_headline_changes_no_signature():
    plain, named = _cfg(), _cfg(headline="pass@8")
    assert train_signature(plain) == train_signature(named)
    assert eval_settings_signature(plain) == eval_settings_signature(named)


def test_tables_and_figures_read_the_named_column():
    from lorarl.report.tables import avg_columns, primary_metrics

    cells = pd.DataFrame({"cell": ["a-s0", "a-s1"], "init": ["a", "a"], "seed": ["0", "1"],
                          "gsm8k/pass@1": [0.8, 0.9], "aime24/avg@32": [0.2, 0.3], "aime24/pass@32": [0.6, 0.7]})
    assert primary_columns(cells) == ["gsm8k/pass@1", "aime24/avg@32"]  # no headline: the first metric
    assert primary_columns(cells, {"aime24": "pass@32", "math500": "pass@4"}) == ["gsm8k/pass@1", "aime24/pass@32"]
    study = SimpleNamespace(axes={"init": None, "seed": None}, seed_axis="seed")
    data = SimpleNamespace(cells=cells, study=study, keys=["init"])
    from unittest import mock

    with mock.patch("lorarl.report.columns.headlines", return_value={"aime24": "pass@32"}), \
            mock.patch("lorarl.report.tables.average_of", return_value="benchmarks"):  # paper 003: the plain mean
        assert primary_metrics(data) == ["gsm8k/pass@1", "aime24/pass@32"]
        avg = avg_columns(data)
    assert "aime24/pass@32_mean" in avg and "aime24/avg@32_mean" not in avg
    assert avg["avg_mean"].iloc[0] == pytest.approx((0.8 + 0.6 + 0.9 + 0.7) / 4)  # Avg over the pass@32 column
