"""The hosting plan (lorarl.pack.hosting) is what Snakemake and `lorarl doctor` plan: for a table of cases (packing
off, fixed packs, resident places, finished cells, an adaptive study's rung segments, the search on and off), the
training jobs of a `snakemake -n` (their rules and wildcards) and the doctor's planned jobs
(lorarl.pipeline.doctor.jobs.planned_jobs) are the plan's, and the plan is the one each case expects."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorarl.pack.hosting import MEMBER_PRIORITY, PACK_PRIORITY, Host, Runtime, hosting_plan, solo_host
from lorarl.pack.plan import max_cells, pack_id, resident_places
from lorarl.pipeline.doctor.jobs import planned_jobs
from lorarl.language.study import load_study, study_cells

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {"model": "local:tiny-test", "task": {"name": "synthetic", "n_train": 64, "n_eval": 8},
            "adapter": {"method": "lora", "rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
            "train": {"steps": 4, "prompts_per_step": 2, "generations": 2, "max_completion_length": 16, "beta": 0.0},
            "eval": {"max_new_tokens": 16, "eval_every": 2}}
# two lengths (a fixed pack keeps train.steps in its key, a resident job does not); a search with a rung at 2
STUDIES = {
    "plain": {"axes": {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]},
                       "length": {"field": "train.steps", "prefix": "n", "values": [4, 6]}}},
    "srch": {"axes": {"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 8]},
                      "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}},
             "search": {"rule": "sha", "eta": 2, "paired": ["seed"]}},
}
# case: the `pack:` config, --config search, finished cells, cells holding a TRL checkpoint -> each study's expected
# hosts (kind, step, segment; cells sharing a letter share a job)
CASES = {
    "off": (1, "on", (), (), {
        "plain": {"s0-n4": ("solo", 4, False), "s0-n6": ("solo", 6, False), "s1-n4": ("solo", 4, False),
                  "s1-n6": ("solo", 6, False)},
        "srch": {c: ("solo", 2, True) for c in ("r1-s0", "r1-s1", "r8-s0", "r8-s1")}}),
    "fixed": ({"max_cells": 2}, "on", (), (), {
        "plain": {"s0-n4": ("pack", 4, False, "a"), "s1-n4": ("pack", 4, False, "a"),
                  "s0-n6": ("pack", 6, False, "b"), "s1-n6": ("pack", 6, False, "b")},
        "srch": {"r1-s0": ("pack", 2, True, "a"), "r1-s1": ("pack", 2, True, "a"),
                 "r8-s0": ("pack", 2, True, "b"), "r8-s1": ("pack", 2, True, "b")}}),
    "resident": ({"resident": True, "places": 2}, "on", (), (), {
        "plain": {c: ("resident", int(c[-1]), False, "a") for c in ("s0-n4", "s0-n6", "s1-n4", "s1-n6")},
        "srch": {c: ("resident", 2, True, "a") for c in ("r1-s0", "r1-s1", "r8-s0", "r8-s1")}}),
    "finished, TRL checkpoint, search off": ({"max_cells": 2}, "off", ("plain/s0-n4", "srch/r1-s0"), ("plain/s1-n6",), {
        "plain": {"s1-n4": ("solo", 4, False), "s0-n6": ("solo", 6, False), "s1-n6": ("solo", 6, False)},
        "srch": {"r1-s1": ("pack", 4, False, "a"), "r8-s0": ("pack", 4, False, "a"), "r8-s1": ("solo", 4, False)}}),
}


def _write(wd: Path, name: str) -> None:
    (wd / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "defaults": DEFAULTS, **STUDIES[name]},
                                                    sort_keys=False))


def _dry_jobs(wd: Path, pack, search: str) -> dict[tuple, int]:
    """(rule, study, cell or pack id[, step]) of every training job a dry run plans -> its Snakemake priority; the
    evaluate and diagnose jobs' priorities under ("evaluate" / "diagnose", study, cell)."""
    (wd / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(wd / f"{s}.yaml") for s in STUDIES], "results": "results", "launcher": "local",
         "slurm": {}, "pack": pack, "search": search}))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(wd),
           "--configfile", str(wd / "config.yaml"), "--cores", "1", "-n", "all", "--quiet", "host"]
    run = subprocess.run(cmd, cwd=wd, capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = {}
    for rule, wc, prio in re.findall(r"^rule (train|train_pack|train_rung|evaluate|diagnose):\n(?:    .*\n)*?"
                                     r"    wildcards: (.*)\n(?:    priority: (\d+)\n)?", run.stdout + run.stderr, re.M):
        w = dict(kv.split("=", 1) for kv in wc.split(", "))
        key = (rule, w["study"], w.get("cell") or w["pack"], *([int(w["step"])] if "step" in w else []))
        out[key[:3] if rule in ("evaluate", "diagnose") else key] = int(prio or 0)
    return out


def _plan_jobs(study: str, plan: dict[str, Host]) -> set[tuple]:
    """The same tuples from the plan: a pack's job, and each cell's own train (or train_rung) job."""
    out = set()
    for cid, h in plan.items():
        out.add(("train_rung", study, cid, h.step) if h.segment else ("train", study, cid))
        if h.packed:
            out.add(("train_pack", study, h.job))
    return out


def _doctor_jobs(study: str, jobs) -> set[tuple]:
    out = set()
    for j in jobs:
        if j.kind == "pack":
            out.add(("train_pack", study, j.cell))
        elif j.kind in ("train", "publish"):
            step = j.target.removeprefix("until=")
            out.add((j.rule, study, j.cell, *([int(step)] if step else [])))
    return out


def _finish(res: Path, study, cell_id: str) -> None:
    cell = next(c for c in study_cells(study) if c.id == cell_id)
    d = res / study.name / cell_id  # the train rule's outputs (workflow/rules/train.smk)
    (d / "adapter").mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"config_hash": cell.hash}))
    for f in ("metrics.csv", "cell.json"):
        (d / f).write_text("")


@pytest.mark.parametrize("case", list(CASES))
def test_snakemake_and_the_doctor_plan_the_hosting_plan(tmp_path, case):
    pack, search, finished, trl, expected = CASES[case]
    for name in STUDIES:
        _write(tmp_path, name)
    studies = {n: load_study(tmp_path / f"{n}.yaml") for n in STUDIES}
    res = tmp_path / "results"
    if finished:  # the base model too, older than the cells' outputs (else Snakemake retrains after building it)
        (res / "models" / "tiny-test").mkdir(parents=True)
        (res / "models" / "tiny-test" / "config.json").write_text("{}")
    for f in finished:
        s, c = f.split("/")
        _finish(res, studies[s], c)
    for f in trl:  # TRL's complete checkpoint at step 2 (lorarl.train.checkpoint): only TRL resumes it
        s, c = f.split("/")
        ckpt = res / s / ".checkpoints" / c / "checkpoint-2"
        ckpt.mkdir(parents=True)
        cell = next(x for x in study_cells(studies[s]) if x.id == c)
        (ckpt / "lorarl.json").write_text(json.dumps({"step": 2, "config_hash": cell.hash, "format": "hf"}))
    runtime = Runtime(max_cells(pack), resident_places(pack), search_on=search == "on")
    planned, doctor, members = set(), set(), set()
    for name, study in studies.items():
        plan = hosting_plan(study, runtime, res)
        letters: dict[str, str] = {}  # a pack's letter: in the order its first member comes
        for h in plan.values():
            if h.packed and h.job not in letters:
                letters[h.job] = "abcd"[len(letters)]
        got = {c: (h.kind, h.step, h.segment, *([letters[h.job]] if h.packed else [])) for c, h in plan.items()}
        assert got == expected[name], (case, name)
        for h in plan.values():
            if h.packed:  # the job's id names its members, its rung and its kind (lorarl.pack.plan.pack_id)
                assert h.job == pack_id(list(h.members), until=h.until, resident=h.kind == "resident")
        planned |= _plan_jobs(name, plan)
        members |= {(name, c) for c, h in plan.items() if h.packed}
        jobs = planned_jobs(study, res, runtime.max_cells, runtime.places, runtime.search_on)
        doctor |= _doctor_jobs(name, jobs)
        segments = {c for c, h in plan.items() if h.segment}  # their evaluations wait on the search's decisions
        assert not [j for j in jobs if j.kind in ("evaluate", "diagnose") and j.cell in segments], case
    dry = _dry_jobs(tmp_path, pack, search)
    assert {k for k in dry if k[0] not in ("evaluate", "diagnose")} == planned, case
    assert doctor == planned, case
    # Snakemake starts a pack first, its members' train jobs next (their publish), evaluations and diagnoses after
    for k, prio in dry.items():
        want = (PACK_PRIORITY if k[0] == "train_pack" else MEMBER_PRIORITY if k[0] in ("train", "train_rung")
                and (k[1], k[2]) in members else 0)
        assert prio == want, (case, k)
    assert any(k[0] == "evaluate" for k in dry) and PACK_PRIORITY > MEMBER_PRIORITY > 0, case


def test_a_cell_holding_a_trl_checkpoint_trains_in_its_own_job(tmp_path, monkeypatch):
    """Packing on, a cell whose newest checkpoint is TRL's is hosted solo (only TRL resumes it), one whose state is a
    pack's trains as a pack of one (``alone``) when no pack holds it: the rule a train job asks at its start too."""
    from lorarl.train import cellstate

    _write(tmp_path, "plain")
    study = load_study(tmp_path / "plain.yaml")
    engines = {"s1-n4": "hf", "s1-n6": "pack"}
    monkeypatch.setattr(cellstate, "waiting_engine", lambda res, s, cell: engines.get(cell.id))
    plan = hosting_plan(study, Runtime(max_cells=2), tmp_path / "results")
    assert (plan["s1-n4"].kind, plan["s0-n4"].kind) == ("solo", "solo")  # its pack partner is alone in its group
    assert plan["s1-n6"].kind == plan["s0-n6"].kind == "pack"  # a pack's state resumes in a pack
    cell = next(c for c in study_cells(study) if c.id == "s1-n6")
    assert solo_host(tmp_path / "results", "plain", cell) == Host("alone", "s1-n6", 6)
    assert solo_host(tmp_path / "results", "plain", cell, 2).until == 2
