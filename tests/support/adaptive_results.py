"""Synthetic results of an adaptive study (no training): every cell finished (tests/support/study_shapes.py), rung
values set by rank (the higher the rank, the better), the real decision function run on them, and the cells of
the stopped settings cut back to what a censored cell leaves (its rung's evaluation and mark, no summary).
``added``: the seeds a hypothesis added (lorarl.language.adaptive.seeds) are written as finished cells too. Used by
the adaptive report tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from lorarl import paths
from lorarl.adaptive.ledger import update_hypotheses, update_search
from lorarl.language.study import cell_table, load_study
from tests.support.study_shapes import fake_results
from tests.support.study import tiny_study

STUDY = {**tiny_study("adr", task={"name": "synthetic", "n_train": 16, "n_eval": 8},
                      adapter={"method": "lora", "rank": 2, "alpha": 4},
                      train={"steps": 6, "prompts_per_step": 2, "generations": 2}, eval={"eval_every": 2},
                      axes={"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 2, 4, 8]},
                            "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}),
         "search": {"rule": "sha", "rungs": [2], "eta": 2},
         "hypotheses": {"top": {"kind": "non_inferiority", "a": {"rank": 4}, "b": {"rank": 8}, "margin": 0.1,
                                "min_seeds": 2, "max_seeds": 2}}}


def rung_value(cell) -> float:
    """The rung value a cell records: its rank / 10, plus its seed / 100."""
    return int(cell.axes["rank"]) / 10 + int(cell.axes["seed"]) / 100


def cut_to_rung(res: Path, study: str, cid: str, step: int) -> None:
    """Leave what a cell stopped at rung ``step`` leaves: its evaluations up to the rung and its rung mark."""
    cdir = paths.cell_dir(res, study, cid)
    for p in [cdir / "summary.json", cdir / "metrics.csv", cdir / "diagnostics.parquet", *(cdir / "eval").glob("*")]:
        keep = "@" in p.name and int(p.name.split("@")[1].split(".")[0]) <= step
        if p.is_dir():
            shutil.rmtree(p)
        elif not keep:
            p.unlink(missing_ok=True)
    (cdir / "rungs").mkdir(exist_ok=True)
    (cdir / "rungs" / f"step-{step}.json").write_text(json.dumps({"cell": cid, "step": step, "state": "at_rung"}))


def adaptive_results(tmp_path: Path, spec: dict, added: bool = False, value=rung_value):
    """(study file, study, its cell table, results dir) of ``spec`` decided on synthetic rung values."""
    f = tmp_path / f"{spec['name']}.yaml"
    f.write_text(yaml.safe_dump(spec, sort_keys=False))
    study = load_study(f)
    table = cell_table(study)
    res = fake_results(study, tmp_path / "results", seed=3)
    if added:
        fake_results(study, res, seed=4, cells=table.extra_cells())
    rungs = study.search.rungs
    for c in table.cells:
        for step in rungs:
            p = paths.path("eval_step_summary", results=res, study=study.name, cell=c.id, benchmark="synthetic",
                           step=step)
            doc = json.loads(p.read_text())
            doc["metrics"]["pass@1"]["value"] = value(c) + step / 1000
            p.write_text(json.dumps(doc))
    led = update_search(study, table, res)
    for name, st in led["state"].items():
        if st["state"] == "stopped":
            for cid in led["settings"][name]["cells"]:
                cut_to_rung(res, study.name, cid, st["rung"])
    update_hypotheses(study, table, res)
    return f, study, table, res
