"""End to end through Snakemake with packing on (`--config pack=2`): the 2-cell demo-shaped study trains
as ONE pack job; each member's train job publishes its outputs; downstream stages run per cell unchanged.
Switching packing off reruns nothing; `--forcerun` of one member's summary retrains that cell alone, solo."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support.snakemake import STUDY, active_cell_runs, jobs_run, run_snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_test_base):
    from tests.support.trained import place_base

    wd = tmp_path_factory.mktemp("packpipe")
    place_base(tiny_test_base, wd / "results")  # the session's base model: no base_model job here
    (wd / "study.yaml").write_text(yaml.safe_dump(STUDY))
    (wd / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(wd / "study.yaml")], "results": "results", "launcher": "local", "slurm": {},
         "pack": {"max_cells": 2}}))
    return wd


def slow_pack_launcher(folder: Path, delay_s: float) -> dict[str, str]:
    """An environment whose Python processes load a sitecustomize that holds every `lorarl launch pack` back
    ``delay_s`` s at its start: the members' own train jobs reach their hand-over before the pack's launcher has
    claimed them, as on a loaded machine (the order Snakemake starts jobs of one round in is not fixed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys, time\n"
        f"if sys.argv[1:3] == ['launch', 'pack']:\n    time.sleep({delay_s})\n")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)}


def test_pack_job_then_noop_then_pack_off_then_forced_member_alone(workdir):
    # the pack's launcher starts 8 s after its members' train jobs: Snakemake's planned hand-over states (onstart,
    # lorarl.pack.handover) keep them waiting for it, so the pack trains both members
    first = run_snakemake(workdir, "all", env=slow_pack_launcher(workdir / "slow", 8.0))
    stats = jobs_run(first)
    assert stats.get("train_pack") == 1 and stats.get("train") == 2 and stats.get("evaluate") == 3, stats
    assert "base_model" not in stats, stats  # the session's copied base model is taken as made
    res = workdir / "results" / "e2e"
    (record,) = (res / ".packs").glob("pack-*.json")
    rec = json.loads(record.read_text())
    assert rec["trained"] == ["s0", "s1"] and rec["states"] == {"s0": "done", "s1": "done"}
    for cell in ("s0", "s1"):
        d = res / cell
        for f in ("cell.json", "metrics.csv", "summary.json", "adapter/adapter_config.json", "eval/synthetic.json",
                  "diagnostics.parquet", "provenance/train.json"):
            assert (d / f).exists(), f
        assert not (d / ".packed").exists() and not (d / ".pack.tmp").exists()
        assert json.loads((d / ".handover.json").read_text())["state"] == "published"  # planned, claimed, staged: moved
        s = json.loads((d / "summary.json").read_text())
        assert s["pack"] == {"id": rec["pack"], "members": ["s0", "s1"]} and s["state"] == "done"
        assert list(pd.read_csv(d / "metrics.csv")["step"]) == [1, 2, 3]
        assert json.loads((d / "provenance" / "train.json").read_text())["packed"]["pack"] == rec["pack"]
        assert "trained in its pack" in (d / "logs" / "train.log").read_text()
    # the member whose train job started beside the pack (2 cores: the other one after it) waited for it
    assert any("its pack is training it" in (res / c / "logs" / "train.log").read_text() for c in ("s0", "s1"))
    runs, client = active_cell_runs(workdir / "results")
    assert sorted(r.data.tags["lorarl.cell_id"] for r in runs) == ["s0", "s1"]
    for r in runs:  # each member is its own MLflow run with the cell's tags and params
        assert r.data.tags["lorarl.pack"] == rec["pack"] and r.data.tags["axis.seed"] in ("0", "1")
        assert r.data.params["adapter.rank"] == "2"
        assert len(client.get_metric_history(r.info.run_id, "reward")) == 3
    assert int(pd.read_csv(res / "tables" / "summary.csv")["n_seeds"].iloc[0]) == 2

    again = run_snakemake(workdir, "all")
    assert "Nothing to be done" in again.stderr + again.stdout
    off = run_snakemake(workdir, "all", "--config", "pack=1")  # packing is runtime: switching it reruns nothing
    assert "Nothing to be done" in off.stderr + off.stdout

    s0 = (res / "s0" / "summary.json").stat().st_mtime_ns
    forced = run_snakemake(workdir, "results/e2e/s1/summary.json", "--forcerun", "results/e2e/s1/summary.json")
    stats = jobs_run(forced)
    assert stats.get("train") == 1 and "train_pack" not in stats, stats  # that cell alone, solo
    assert "pack" not in json.loads((res / "s1" / "summary.json").read_text())
    assert (res / "s0" / "summary.json").stat().st_mtime_ns == s0
