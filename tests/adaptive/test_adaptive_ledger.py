"""The ledgers on files: rung values come from the cells' own evaluation records (written here by the
evaluate stage's own writer), stale records and failed cells are read as such, the ledger is rewritten
only when its bytes change, the per-cell plan follows it, and hypotheses read per-problem scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lorarl import paths
from lorarl.adaptive import ledger
from lorarl.grading.protocols import Protocol
from lorarl.evaluate.records import Sample, write_records
from lorarl.language.study import cell_table, load_study
from tests.support.study import tiny_study

STUDY = {**tiny_study("adl", task={"name": "synthetic", "n_train": 16, "n_eval": 8},
                      adapter={"method": "lora", "rank": 2, "alpha": 4},
                      train={"steps": 12, "prompts_per_step": 2, "generations": 2, "lr": 1.0e-3},
                      eval={"max_new_tokens": 8, "eval_every": 2},
                      axes={"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 2, 4, 8]},
                            "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}}),
         "search": {"rule": "sha", "rungs": [2, 6], "eta": 2},
         "hypotheses": {"r8_vs_r4": {"kind": "superiority", "a": {"rank": 8}, "b": {"rank": 4}, "max_seeds": 3}}}


def setup(tmp_path: Path):
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    study = load_study(f)
    return study, cell_table(study), tmp_path / "results"


def record(results: Path, cell, correct: list[bool], step: int | None = None, config_hash: str | None = None):
    """The evaluate stage's own writer: one greedy sample per problem p0, p1, ..."""
    samples = [Sample(f"p{i}", 0, "q", "1", "1" if c else "0", "1" if c else "0", c, False, False, 1)
               for i, c in enumerate(correct)]
    out = paths.cell_dir(results, "adl", cell.id) / "eval"
    write_records(out, "synthetic", samples, Protocol.greedy(), grader="math", step=step,
                  meta={"cell": cell.id, "config_hash": config_hash or cell.hash})


def acc(k: int, n: int = 10) -> list[bool]:
    return [i < k for i in range(n)]


def test_search_ledger_from_the_cells_records(tmp_path: Path):
    study, table, results = setup(tmp_path)
    by = {c.id: c for c in table.cells}
    score = {"1": 3, "2": 5, "4": 7, "8": 8}
    for c in table.cells:
        record(results, c, acc(score[c.axes["rank"]]), step=2)
    record(results, by["r8-s2"], acc(0), step=2, config_hash="0ld0ld0ld0")  # stale: trained under another config
    (paths.cell_dir(results, "adl", "r2-s1") / "summary.json").write_text(json.dumps(
        {"config_hash": by["r2-s1"].hash, "state": "diverged", "diverged_at_step": 1}))
    led = ledger.update_search(study, table, results)
    path = ledger.search_path(results, "adl")
    assert path == results / "adl" / "adaptive" / "search.json" and json.loads(path.read_text()) == led
    assert led["rule"]["metric"] == "synthetic/pass@1" and led["failed"] == {"r2-s1": 1}
    assert led["rungs"][0]["decided"] == {"rank=2": "fail"}  # rank 8's stale seed holds the rung
    assert led["state"]["rank=8"] == {"state": "running", "rung": 2}
    record(results, by["r8-s2"], acc(8), step=2)  # its rerun records rung 2
    led = ledger.update_search(study, table, results)
    assert led["rungs"][0]["decided"] == {"rank=1": "stop", "rank=2": "fail", "rank=4": "promote", "rank=8": "promote"}
    used = led["rungs"][0]["values"]["rank=4"]
    assert used["mean"] == pytest.approx(0.7) and used["cells"] == {f"r4-s{s}": 0.7 for s in range(3)}
    before = path.stat().st_mtime_ns, path.read_bytes()
    assert ledger.update_search(study, table, results) == led  # again: same decisions, file untouched
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
    plan = ledger.cell_plan(led, {c.id: c.config.train.steps for c in table.cells})
    assert plan["r4-s0"] == {"state": "running", "until": 6, "censored": False}
    assert plan["r1-s2"] == {"state": "stopped", "until": 2, "censored": True}
    assert plan["r2-s0"]["state"] == "failed"
    for c in ("r4-s0", "r4-s1", "r4-s2", "r8-s0", "r8-s1", "r8-s2"):
        record(results, by[c], acc(9 if c.startswith("r8") else 6), step=6)
    led = ledger.update_search(study, table, results)
    plan = ledger.cell_plan(led, {c.id: c.config.train.steps for c in table.cells})
    assert plan["r8-s1"] == {"state": "finishing", "until": 12, "censored": False} and plan["r4-s1"]["censored"]
    assert ledger.censored_cells(led) == {f"r{r}-s{s}" for r in (1, 4) for s in range(3)}


def test_hypotheses_ledger_pairs_by_seed_and_problem(tmp_path: Path):
    study, table, results = setup(tmp_path)
    by = {c.id: c for c in table.cells}
    # seeds 0, 1: rank 8 solves 9 of 10 problems, rank 4 the same 5 of them: d = 0.4 per seed
    for s in (0, 1):
        record(results, by[f"r8-s{s}"], acc(9))
        record(results, by[f"r4-s{s}"], acc(5))
    doc = ledger.update_hypotheses(study, table, results)
    h = doc["hypotheses"]["r8_vs_r4"]
    assert [o["difference"] for o in h["observations"]] == [0.4, 0.4, None]
    assert h["decision"] == "undecided" and h["pending"] and h["needs_seeds"] == 0  # seed 2 is still to come
    record(results, by["r8-s2"], [True] * 9 + [False])
    record(results, by["r4-s2"], [False] * 5 + [True] * 5)  # other problems solved, same difference
    h = ledger.update_hypotheses(study, table, results)["hypotheses"]["r8_vs_r4"]
    assert h["observations"][2]["difference"] == 0.4 and h["metric"] == "synthetic/pass@1"
    assert h["decision"] == "inconclusive" and h["seeds_used"] == 3  # equal differences: no spread, no evidence
    assert json.loads(ledger.hypotheses_path(results, "adl").read_text())["hypotheses"]["r8_vs_r4"] == h
    # a setting the search stopped is censored: its final metric is never observed
    search = {"state": {"rank=4": {"state": "stopped", "rung": 2}},
              "settings": {"rank=4": {"cells": ["r4-s0", "r4-s1", "r4-s2"]}}}
    ledger.write_if_changed(ledger.search_path(results, "adl"), search)
    assert ledger.update_hypotheses(study, table, results)["hypotheses"]["r8_vs_r4"]["decision"] == "censored"


def test_a_bad_seed_is_shown_beside_the_claim(tmp_path: Path):
    """A seed whose cell raised a collapse flag (finished, so its difference counts) or diverged (failed, skipped)
    is listed with what went wrong, and every state says what its claim assumes (lorarl.adaptive.hypotheses)."""
    from lorarl.adaptive.hypotheses import ASSUMPTION, robustness_note

    study, table, results = setup(tmp_path)
    by = {c.id: c for c in table.cells}
    for s in (0, 1, 2):
        record(results, by[f"r8-s{s}"], acc(9 - s))
        record(results, by[f"r4-s{s}"], acc(5))
    (paths.cell_dir(results, "adl", "r4-s1") / "summary.json").write_text(json.dumps(
        {"config_hash": by["r4-s1"].hash, "state": "done", "flags": {"entropy_collapse": 7}}))
    (paths.cell_dir(results, "adl", "r8-s2") / "summary.json").write_text(json.dumps(
        {"config_hash": by["r8-s2"].hash, "state": "diverged", "diverged_at_step": 4}))
    (paths.cell_dir(results, "adl", "r8-s0") / "summary.json").write_text(json.dumps(  # an older config's flag
        {"config_hash": "0ld0ld0ld0", "state": "done", "flags": {"entropy_collapse": 2}}))
    h = ledger.update_hypotheses(study, table, results)["hypotheses"]["r8_vs_r4"]
    assert h["bad_seeds"] == {"1": "b: collapse flag entropy_collapse at step 7", "2": "a: diverged at step 4"}
    assert h["seeds_failed"] == ["2"] and h["assumption"] == ASSUMPTION
    note = robustness_note("r8_vs_r4", study.hypotheses["r8_vs_r4"])
    assert note.startswith("hypotheses.r8_vs_r4: claims assume near-Gaussian") and "max_seeds 3" in note


def test_lorarl_cells_says_what_the_claims_rest_on(tmp_path: Path, capsys):
    from lorarl.cli import main

    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    assert main(["cells", str(f)]) == 0
    out = capsys.readouterr().out
    assert "hypotheses.r8_vs_r4: claims assume near-Gaussian per-seed differences" in out
    assert "type-I error reaches 0.08-0.30" in out
