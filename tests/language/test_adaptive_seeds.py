"""Seeds a hypothesis adds at run time (lorarl.language.adaptive.seeds): ordinary cells whose ids and hashes are what the
axes give them, found by id while `lorarl cells` and every existing id stay as they are; and, through Snakemake
(a real checkpoint job on recorded results, then a dry run), an undecided comparison asks for exactly the next
seed of its two settings and nothing else."""

from __future__ import annotations

import copy
import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml

from lorarl import paths
from lorarl.language.study import StudyError, cell_table, load_study, parse_study
from tests.support.snakemake import run_snakemake
from tests.support.study import tiny_study

REPO = Path(__file__).resolve().parents[2]
STUDY = {**tiny_study("hy", eval=None, task={"name": "synthetic", "n_train": 16, "n_eval": 4},
                      adapter={"method": "lora", "rank": 2, "alpha": 4},
                      train={"steps": 4, "prompts_per_step": 2, "generations": 2},
                      axes={"rank": {"field": "adapter.rank", "prefix": "r", "values": [4, 8]},
                            "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}}),
         "hypotheses": {"r8_vs_r4": {"kind": "superiority", "a": {"rank": 8}, "b": {"rank": 4}, "min_seeds": 3,
                                     "max_seeds": 5}}}


def write(tmp_path: Path, doc: dict, name: str = "hy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_added_seeds_are_cells_with_stable_ids_and_hashes(tmp_path):
    study = load_study(write(tmp_path, STUDY))
    table = cell_table(study)
    assert table.ids == ["r4-s0", "r4-s1", "r4-s2", "r8-s0", "r8-s1", "r8-s2"]  # `lorarl cells`: unchanged
    assert [c.id for c in table.extra_cells()] == ["r4-s3", "r4-s4", "r8-s3", "r8-s4"]
    assert table.ids == ["r4-s0", "r4-s1", "r4-s2", "r8-s0", "r8-s1", "r8-s2"]
    wide = {**STUDY, "axes": {**STUDY["axes"], "seed": {**STUDY["axes"]["seed"], "values": [0, 1, 2, 3, 4]}}}
    wide.pop("hypotheses")
    same = {c.id: c.hash for c in cell_table(load_study(write(tmp_path, wide, "wide.yaml"))).cells}
    for c in table.cells + table.extra_cells():  # the ids and hashes the axes give them
        assert same[c.id] == c.hash and table.cell(c.id) is c
    assert table.cell("r8-s4").config.seed == 4
    assert table.notes == ["hypotheses may add seeds 3..4 to their two settings at run time: ordinary cells, found "
                           "by id (docs/adaptive.md)"]  # what `lorarl cells` prints under its table
    bare = {k: v for k, v in STUDY.items() if k != "hypotheses"}
    assert [(c.id, c.hash) for c in cell_table(load_study(write(tmp_path, bare, "bare.yaml"))).cells] == \
        [(c.id, c.hash) for c in table.cells]  # the block moves no existing id or hash


def test_seeds_beyond_a_non_integer_axis_are_refused(tmp_path):
    doc = {**copy.deepcopy(STUDY), "axes": {**STUDY["axes"], "seed": {"field": "seed", "values": [
        {"label": "a", "set": {"seed": 1}}, {"label": "b", "set": {"seed": 2}}, {"label": "c", "set": {"seed": 3}}]}}}
    with pytest.raises(StudyError, match=r"hypotheses.r8_vs_r4.max_seeds: 5 needs seeds beyond the 3"):
        load_study(write(tmp_path, doc))
    doc["hypotheses"]["r8_vs_r4"]["max_seeds"] = 3
    assert parse_study(doc).hypotheses["r8_vs_r4"].max_seeds == 3 and load_study(write(tmp_path, doc, "ok.yaml"))


def _finished(study, res: Path, scores: dict[str, list[bool]]) -> None:
    """Finished cells on disk, as the train and evaluate jobs write them (older inputs first)."""
    from tests.support.study_shapes import fake_results

    model = res / "models" / "tiny-test" / "config.json"
    model.parent.mkdir(parents=True)
    model.write_text("{}")
    for c in cell_table(study).cells:
        kw = dict(results=res, study=study.name, cell=c.id)
        paths.path("adapter", **kw).mkdir(parents=True)
        paths.path("cell_json", **kw).write_text(json.dumps({"id": c.id, "hash": c.hash}))
    time.sleep(1.1)
    fake_results(study, res)
    for cid, correct in scores.items():  # one sample per problem, greedy pass@1
        p = paths.path("eval_samples", results=res, study=study.name, cell=cid, benchmark="synthetic")
        p.write_text("".join(json.dumps({"problem_id": f"p{i}", "sample": 0, "correct": x}) + "\n"
                             for i, x in enumerate(correct)))


def test_an_undecided_comparison_adds_one_seed_as_ordinary_cells(tmp_path):
    from lorarl.pipeline.decisions.adaptive_flow import AdaptiveStudy

    sf = write(tmp_path, STUDY)
    study = load_study(sf)
    res = tmp_path / "results"
    # per seed, rank 8 minus rank 4 over 4 problems: +0.25, -0.25, +0.25: an open question after 3 seeds
    good, bad = [True, True, False, False], [True, False, False, False]
    _finished(study, res, {"r8-s0": good, "r4-s0": bad, "r8-s1": bad, "r4-s1": good, "r8-s2": good, "r4-s2": bad})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"studies": [str(sf)], "results": "results",
                                                          "launcher": "local", "slurm": {}}))
    tag = AdaptiveStudy(study, cell_table(study), "results", True, print, print).hyp_tag
    look3 = paths.path("hypothesis_look", results="results", study="hy", tag=tag, hypothesis="r8_vs_r4", n=3)
    run_snakemake(tmp_path, str(look3), cores=1)  # the checkpoint job itself, on the recorded results
    view = json.loads((tmp_path / look3).read_text())
    assert view["decision"] == "undecided" and [o["difference"] for o in view["observations"]] == [0.25, -0.25, 0.25]
    dry = run_snakemake(tmp_path, "-n", "all", "--quiet", "host", cores=1)
    text = dry.stdout + dry.stderr
    assert "[lorarl] hy: hypothesis r8_vs_r4 (superiority): undecided after 3 seed(s) (cap 5); waits on seed 4" in text
    cells = set(re.findall(r"cell=(r\d-s\d)", text))
    jobs = {ln.split()[0]: int(ln.split()[1]) for ln in text.split("Job stats:")[1].splitlines()[3:]
            if len(ln.split()) == 2 and ln.split()[1].isdigit()}
    assert jobs.get("train") == 2 and jobs.get("hypothesis_look") == 1, jobs  # seed 3 of both settings, look 4
    assert {"r4-s3", "r8-s3"} <= cells and not {"r4-s4", "r8-s4"} & cells  # no seed past the next one


def test_search_off_trains_the_stopped_cells_on_and_their_hypothesis_waits_on_them(tmp_path):
    """`--config search=off` after the search stopped rank 1 (a hypothesis at that rank, one seed on the axis): a
    dry run plans the stopped cells to their end and the look that adds the hypothesis's second seed, and says the
    hypothesis waits (not censored); once those cells finished, the hypothesis is decided, not censored."""
    from lorarl.adaptive.ledger import hypothesis_censored, update_hypotheses
    from tests.support.adaptive_results import STUDY as ADR, adaptive_results
    from tests.support.study_shapes import fake_results

    spec = copy.deepcopy(ADR)
    spec["axes"] = {"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 8]},
                    "kl": {"field": "train.beta", "prefix": "kl", "values": [0.0, 0.05]},
                    "seed": {"field": "seed", "prefix": "s", "values": [0]}}
    spec["search"] = {"rule": "sha", "rungs": [2], "eta": 2, "paired": ["seed", "kl"]}
    spec["hypotheses"] = {f"h{r}": {"kind": "non_inferiority", "a": {"rank": r, "kl": 0.0}, "b": {"rank": r, "kl": 0.05},
                                    "margin": 0.05, "min_seeds": 2, "max_seeds": 3} for r in (1, 8)}
    model = tmp_path / "results" / "models" / "tiny-test" / "config.json"
    model.parent.mkdir(parents=True)
    model.write_text("{}")
    os.utime(model, (1e9, 1e9))  # built before every result
    f, study, table, res = adaptive_results(tmp_path, spec)
    assert hypothesis_censored(study, table, res, study.hypotheses["h1"])  # search on: r1's cells stopped
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"studies": [str(f)], "results": "results",
                                                          "launcher": "local", "slurm": {}}))
    dry = run_snakemake(tmp_path, "-n", "all", "--quiet", "host", "--config", "search=off", cores=1)
    text = dry.stdout + dry.stderr
    assert "hypothesis h1 (non_inferiority): undecided after 0 seed(s) (cap 3); waits on the records" in text, text
    trained = set(re.findall(r"rule train:[^\n]*\n(?:[^\n]*\n)*?[^\n]*cell=([\w.-]+)", text)) or set(
        re.findall(r"cell=(r\d-kl[\d.]+-s\d)", text))
    assert {"r1-kl0-s0", "r1-kl0.05-s0", "r1-kl0-s1", "r1-kl0.05-s1"} <= trained, text  # stopped ones, then seed 1
    fake_results(study, res, seed=5, cells=[table.cell(c) for c in ("r1-kl0-s0", "r1-kl0.05-s0")])  # trained on
    assert not hypothesis_censored(study, table, res, study.hypotheses["h1"])
    assert update_hypotheses(study, table, res)["hypotheses"]["h1"]["decision"] != "censored"
