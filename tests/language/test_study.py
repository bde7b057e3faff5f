"""Study config validation and matrix expansion (ids, hashes, bundles, exclusions, merging)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorarl.language.study import StudyError, base_cells, study_cells, load_study, parse_study
from tests.support.study import tiny_study

REPO = Path(__file__).resolve().parents[2]


def study(**over):
    raw = tiny_study("t", task=None, adapter=None, eval=None, train={"steps": 3},
                     axes={
                      "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 4, 16]},
                      "kl": {"field": "train.beta", "prefix": "kl", "values": [0.0, 0.05]},
                      "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]},
                  })
    raw.update(over)
    return raw


def test_demo_study_loads_with_eight_cells():
    s = load_study(REPO / "experiments" / "demo.yaml")
    cells = study_cells(s)
    assert len(cells) == 8
    assert [c.id for c in cells][:2] == ["r1-kl0-s0", "r1-kl0-s1"]
    assert [b.id for b in base_cells(s)] == ["base"]


def test_counts_ids_and_resolved_values():
    cells = study_cells(parse_study(study()))
    assert len(cells) == 18
    c = next(c for c in cells if c.id == "r16-kl0.05-s1")
    assert c.config.adapter.rank == 16 and c.config.train.beta == 0.05 and c.config.seed == 1
    assert c.axes == {"rank": "16", "kl": "0.05", "seed": "1"}
    assert c.config.train.steps == 3  # defaults carried through


def test_ids_and_hashes_are_stable_and_distinct():
    a, b = study_cells(parse_study(study())), study_cells(parse_study(study()))
    assert [(c.id, c.hash) for c in a] == [(c.id, c.hash) for c in b]
    assert len({c.hash for c in a}) == len(a)
    assert all(len(c.hash) == 10 for c in a)


def test_hash_changes_only_for_affected_cells():
    base = {c.id: c.hash for c in study_cells(parse_study(study()))}
    raw = study()
    raw["axes"]["rank"]["values"] = [1, 4, 32]
    new = {c.id: c.hash for c in study_cells(parse_study(raw))}
    assert all(new[k] == base[k] for k in new if not k.startswith("r32"))


def test_bundle_axis_expresses_ranks_plus_full_finetuning():
    raw = study()
    raw["axes"]["rank"]["values"] = [1, 4, {"label": "full", "set": {"adapter.method": "full", "train.lr": 1e-5}}]
    cells = study_cells(parse_study(raw))
    full = [c for c in cells if c.axes["rank"] == "full"]
    assert len(cells) == 18 and len(full) == 6
    assert all(c.config.adapter.method == "full" and c.config.train.lr == 1e-5 for c in full)
    assert full[0].id == "rfull-kl0-s0"


def test_exclude_rules_drop_cells():
    raw = study(exclude=[{"rank": 16, "kl": 0.05}])
    cells = study_cells(parse_study(raw))
    assert len(cells) == 15
    assert not any(c.axes["rank"] == "16" and c.axes["kl"] == "0.05" for c in cells)


def test_identical_resolved_cells_are_merged():
    raw = study()
    # rank 8 twice under different labels: the second resolves identically and merges
    raw["axes"]["rank"]["values"] = [8, {"label": "eight", "set": {"adapter.rank": 8}}]
    cells = study_cells(parse_study(raw))
    assert len(cells) == 6
    assert cells[0].aliases == ("reight-kl0-s0",)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda r: r["defaults"].update(bogus=1), "defaults.bogus: unknown field"),
        (lambda r: r["defaults"]["train"].update(steps="many"), "defaults.train.steps"),
        (lambda r: r["defaults"].update(adapter={"method": "lorax"}), "allowed: "),
        (lambda r: r["defaults"].update(task={"name": "mnist"}), "'synthetic'"),
        (lambda r: r["defaults"]["train"].update(loss_type="ppo"), "'grpo'"),
        (lambda r: r["axes"]["rank"].update(values=[]), "axes.rank.values"),
        (lambda r: r["axes"]["rank"].update(field="adapter.rnak"), "adapter.rnak"),
        (lambda r: r.update(exclude=[{"rnk": 1}]), "unknown axis 'rnk'"),
        (lambda r: r.update(exclude=[{"rank": 3}]), "allowed: 1, 4, 16"),
        (lambda r: r["axes"]["kl"].update(values=[-1.0]), "train.beta"),
        (lambda r: r.update(name="bad name"), "name"),
    ],
)
def test_bad_input_names_the_field(mutate, needle):
    raw = study()
    mutate(raw)
    with pytest.raises(StudyError) as err:
        study_cells(parse_study(raw))
    assert needle in str(err.value)


def test_cli_bad_study_exits_nonzero_and_writes_nothing(tmp_path):
    raw = study()
    raw["defaults"]["adapter"] = {"method": "lorax"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    before = set(tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "lorarl.cli", "cells", str(bad)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "adapter.method" in proc.stderr and "allowed:" in proc.stderr
    assert set(tmp_path.rglob("*")) == before


def test_cli_cells_prints_matrix_and_count():
    proc = subprocess.run([sys.executable, "-m", "lorarl.cli", "cells", str(REPO / "experiments" / "demo.yaml")],
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["cell", "rank", "kl", "seed", "hash"]
    assert lines[-1].startswith("8 cells in study 'demo'")
    assert len(lines) == 10


@pytest.mark.slow
@pytest.mark.parametrize("study_file", sorted(p.name for p in (REPO / "experiments").glob("*.yaml")))
def test_every_shipped_study_builds_a_dag(study_file, tmp_path):
    """Each experiments/*.yaml validates and expands into a Snakemake DAG (dry run, nothing written)."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "all", "-n", "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(tmp_path), "--configfile", str(REPO / "config" / "config.yaml"),
         "--config", f"studies=[\"{REPO / 'experiments' / study_file}\"]", "results=results",
         "hub_check=false"],  # as a login node whose compute nodes reach the hub (tests/language/test_hubcheck.py checks it)
        cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "total" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_an_init_or_mask_given_as_the_method_says_where_it_goes():
    """`adapter.method: pissa` (an init, as papers 003/004 name their rows) says to write method lora + init pissa;
    a sparse mask given as the method says method full + mask."""
    with pytest.raises(StudyError) as err:
        study_cells(parse_study(study(defaults={"model": "local:tiny-test", "adapter": {"method": "pissa"}})))
    assert "pissa is an adapter.init" in str(err.value) and "adapter.method: lora and adapter.init: pissa" in str(err.value)
    with pytest.raises(StudyError, match="principal is an adapter.mask.*adapter.method: full and adapter.mask: principal"):
        study_cells(parse_study(study(defaults={"model": "local:tiny-test", "adapter": {"method": "principal"}})))
