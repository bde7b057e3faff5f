"""Every study's tables on results shaped like it (tests/support/study_shapes.py: its axes and values, a few problems
per cell, no training): the summary (csv, md), the stats table (csv, md) and report.html each have one row per
setting, labelled with its axis values, the baseline rows marked as such. A study whose axis is named like a
column the tables add (`method` beside the interval-method column) once lost its labels row by row; axis
names the report uses are refused at load (lorarl.language.reserved), and the check that list is complete is here."""

from __future__ import annotations

import html
import re
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import yaml

from lorarl.report.aggregate import cell_table, markdown, seed_table
from lorarl.report.data import load
from lorarl.report.tables import stats_markdown, stats_table
from lorarl.language.reserved import REPORT_COLUMNS
from lorarl.language.study import StudyError, load_study
from tests.support.study_shapes import fake_bases, fake_results, is_baseline, settings

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
STUDIES = sorted(p for p in EXPERIMENTS.glob("*.yaml") if load_study(p).kind == "grpo")
MARK = " (baseline)"


def _md_rows(md: str) -> list[list[str]]:
    """The rows of a markdown pipe table (header excluded)."""
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in md.splitlines() if ln.startswith("|")]
    return [r for r in rows[1:] if not all(set(c) <= {"-"} for c in r)]


def _html_stats_rows(page: str) -> list[list[str]]:
    """The rows of the page's headline table (the first table after its heading)."""
    part = page.split("<h2>Headline metrics with uncertainty</h2>", 1)[1].split("</table>", 1)[0]
    rows = [[html.unescape(c) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", r)] for r in part.split("<tr>")[1:]]
    return rows[1:]


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_table_has_one_row_per_setting_labelled_with_its_axes(path, tmp_path):
    from lorarl.report import build

    study = load_study(path)
    res = fake_results(study, tmp_path / "results")
    keys = [a for a in study.axes if a != study.seed_axis]
    want = settings(study)
    base = [is_baseline(study, s) for s in want]
    assert not study.baseline or any(base), "the study's baseline names no setting"

    # summary: csv and md
    cells = cell_table(study, res)
    table = seed_table(study, cells)
    assert table[keys].astype(str).to_dict("records") == want
    if study.baseline:
        assert table["is_baseline"].tolist() == base
    rows = _md_rows(markdown(study, table, None, cells))
    assert len(rows) == len(want)
    for row, labels, b in zip(rows, want, base):
        assert [c.removesuffix(MARK) for c in row[:len(keys)]] == list(labels.values()), row
        assert (MARK in " ".join(row[:len(keys)])) == b, row

    # stats: csv (one row per setting and metric) and md (one row per setting)
    data = load(study, res)
    st = stats_table(data)
    st.to_csv(tmp_path / "stats.csv", index=False)
    st = pd.read_csv(tmp_path / "stats.csv", dtype={k: str for k in keys}, keep_default_na=False, na_values=[""])
    got = st[keys].drop_duplicates().to_dict("records")
    assert sorted(map(str, got)) == sorted(map(str, want))
    assert not st.duplicated([*keys, "metric"]).any()
    assert set(st["interval"]) <= {"seeds x problems", "problems only (one seed)", "t over seeds"}
    flags = st[keys].to_dict("records")
    if study.baseline:
        assert st["is_baseline"].tolist() == [is_baseline(study, f) for f in flags]
        assert st.loc[st["is_baseline"], "text"].str.endswith("(baseline)").all()
        assert not st.loc[~st["is_baseline"], "text"].str.endswith("(baseline)").any()
    md_rows = _md_rows(stats_markdown(data, stats_table(data)))
    assert [r[:len(keys)] for r in md_rows] == [list(s.values()) for s in want]
    for row, b in zip(md_rows, base):
        assert all(c.endswith("(baseline)") == b for c in row[len(keys):] if c != "–"), row

    # report.html: the headline table is the stats table, one row per setting (figures are tested elsewhere)
    with mock.patch("lorarl.report.figures.draw_all", return_value=({}, {})):
        page = build(path, res)["report"].read_text()
    page_rows = _html_stats_rows(page)
    assert [r[:len(keys)] for r in page_rows] == [list(s.values()) for s in want]
    for f in sorted((res / study.name / "tables").glob("*.csv")):  # and no table column an axis could take
        assert _stray(study, f.name, _columns(pd.read_csv(f))) == [], f.name


def test_axis_named_like_a_report_column_is_refused_at_load(tmp_path):
    """`cells`, `lorarl cells` and every stage load the study the same way: exit 2, naming the axis."""
    from lorarl.cli import main

    for name in ("interval", "metric", "cell", "mean"):
        spec = {"name": "bad", "defaults": {"model": "local:tiny-test"},
                "axes": {name: {"field": "train.lr", "values": [0.1, 0.2]}}}
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(spec))
        with pytest.raises(StudyError, match=rf"axes\.{name}: axis name '{name}' is a column the report adds"):
            load_study(p)
        assert main(["cells", str(p)]) == 2
    spec["axes"] = {"method": {"field": "train.lr", "values": [0.1, 0.2]}}  # the published studies' axis: fine
    p.write_text(yaml.safe_dump(spec))
    assert len(load_study(p).axes) == 1


def _columns(frame: pd.DataFrame) -> set[str]:
    return {str(c) for c in frame.columns}


def test_every_report_column_beside_the_axes_is_reserved(tmp_path):
    """The report's tables, CSVs and frames on the rich synthetic study (tests/support/report_fixture.py: collapse
    flags, snapshots, diagnostics, KL monitors): every column is an axis, a `/` or `_` name, a training
    metric of metrics.csv, or in lorarl.language.reserved.REPORT_COLUMNS, so the refusal at load covers them all."""
    from lorarl.report import build
    from lorarl.report.aggregate import aggregate
    from tests.support.report_fixture import make_study

    sp, res = make_study(tmp_path)
    study = load_study(sp)
    fake_bases(study, res)
    aggregate(study, res)
    build(sp, res)
    data = load(study, res)
    metrics = _columns(pd.read_csv(next((res / study.name).glob("*/metrics.csv"))))
    seen = {}
    for f in sorted((res / study.name).glob("*/*.csv")):
        if f.name != "metrics.csv":
            seen[f.relative_to(res).as_posix()] = _columns(pd.read_csv(f))
    for name in ("cells", "base", "evcurves", "diag"):
        seen[name] = _columns(getattr(data, name))
    seen["curves"] = _columns(data.curves) - metrics
    assert len(seen) > 20  # the tables and every figure's CSV
    stray = {where: _stray(study, where, cols) for where, cols in seen.items()}
    assert not any(stray.values()), {k: v for k, v in stray.items() if v}


def _stray(study, where: str, cols: set[str]) -> list[str]:
    """Columns that are neither an axis, nor a `/` or `_` name, nor reserved (lorarl.language.reserved). A base row
    names its model under `model`, the column a `model` axis (paper 000's) fills with the same thing; the
    capability table's columns are its base rows' labels."""
    if "capability" in where:
        return []
    allowed = set(study.axes) | REPORT_COLUMNS | ({"model"} if "base" in where else set())
    return sorted(c for c in cols if c not in allowed and "/" not in c and not c.startswith("_"))
