"""The doctor's projection of packed training (lorarl.pipeline.doctor.packs, doctor_jobs, doctor_projection): the
pack-steps of resident jobs (list scheduling on P places) against fixed packs, the resident plan equal to the
workflow's, one start-up per resident job, the report's line, and the memory plan's check of the places. Pure
functions and in-process calls on hand-made measurements: no Snakemake run, no job process (the dry run that
compares the plan with Snakemake's: tests/pack/test_resident_job.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lorarl.pack.plan import pack_id
from lorarl.pack.resident import plan_pack_jobs, plan_residents
from lorarl.pipeline.doctor.jobs import PlannedJob, planned_jobs, rule_counts
from lorarl.pipeline.doctor.packs import (describe, fixed_pack_steps, pack_steps, places_check, places_refused,
                                          resident_schedule)
from lorarl.language.study import study_cells
from tests.support.doctor import _study, measurements

ROOT = Path(__file__).resolve().parents[2]
SHORT_LONG = [20, 60] * 8  # docs/benchmarks.md "Resident packs": 8 cells of 20 steps, 8 of 60, alternating


def stepwise(steps: list[int], places: int) -> tuple[int, int]:
    """The resident job step by step (lorarl.pack.resident.train_resident): every member in a place takes one step;
    at a step where members end while cells wait, the pack is re-formed with the next waiting cells."""
    queue, left, taken, formed = list(steps), [], 0, 0
    while queue or left:
        if queue and len(left) < places:
            formed += 1
            while queue and len(left) < places:
                left.append(queue.pop(0))
        taken += 1
        left = [n - 1 for n in left if n - 1 > 0]
    return taken, formed


@pytest.mark.parametrize("steps, places, want", [
    (SHORT_LONG, 4, (180, 7)),  # the benchmark's resident job: 180 pack-steps, 7 packs formed
    ([20] * 8 + [60] * 8, 4, (160, 4)),  # the same cells, short ones first: no place idles
    ([30] * 8, 4, (60, 2)),  # equal lengths: the fixed packs' schedule
    ([5, 10, 3], 4, (10, 1)),  # more places than cells: one pack, its longest member
    ([5, 10, 3], 1, (18, 3)),  # one place: the cells one after another
    ([10, 10, 10], 2, (20, 2)),  # two members end at one step: one re-form takes the waiting cell
    ([], 3, (0, 0)),
])
def test_resident_schedule_table(steps, places, want):
    assert resident_schedule(steps, places) == want
    if steps:
        assert stepwise(steps, places) == want


def test_resident_schedule_equals_the_job_step_by_step_and_refuses_bad_places():
    rng = random.Random(0)
    for _ in range(200):
        steps = [rng.randint(1, 12) for _ in range(rng.randint(1, 9))]
        places = rng.randint(1, 5)
        assert resident_schedule(steps, places) == stepwise(steps, places), (steps, places)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="places must be an integer >= 1"):
            resident_schedule([3], bad)


@pytest.mark.parametrize("packs, want", [
    ([SHORT_LONG[i:i + 4] for i in range(0, 16, 4)], 240),  # the benchmark's fixed packs: each ends with a 60
    ([[20] * 4, [20] * 4, [60] * 4, [60] * 4], 160),  # lengths apart (the workflow's key): no idle place
    ([[30] * 4, [30] * 4], 60),  # equal lengths: equal to the resident job's
    ([[7], [3, 9]], 16),
    ([], 0),
])
def test_fixed_pack_steps_table(packs, want):
    assert fixed_pack_steps(packs) == want


def mixed(tmp_path, monkeypatch, **defaults):
    """4 cells, seed-major: lengths 10, 30, 10, 30 (s0-n10, s0-n30, s1-n10, s1-n30); the model built."""
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    tmp_path.mkdir(parents=True, exist_ok=True)
    axes = {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]},
            "len": {"field": "train.steps", "prefix": "n", "values": [10, 30]}}
    study = _study(tmp_path, axes, **defaults)
    res = tmp_path / "results"
    (res / "models" / "tiny-test").mkdir(parents=True)
    (res / "models" / "tiny-test" / "config.json").write_text("{}")
    return study, res


def test_resident_plan_is_one_job_per_group_as_the_workflow_plans_it(tmp_path, monkeypatch):
    study, res = mixed(tmp_path, monkeypatch)
    cells = study_cells(study)
    assert [c.config.train.steps for c in cells] == [10, 30, 10, 30]
    jobs = planned_jobs(study, res, 1, places=2)
    packs = [j for j in jobs if j.kind == "pack"]
    assert [j.target.split(",") for j in packs] == [[c.id for c in cells]] == plan_residents(cells)  # study order
    assert packs[0].cell == pack_id([c.id for c in cells], resident=True)  # the rule's wildcard: members and kind
    assert {j.cell: j.holds for j in jobs if j.kind == "publish"} == {c.id: packs[0].key for c in cells}
    assert rule_counts(jobs) == {"train_pack": 1, "train": 4, "evaluate": 5, "diagnose": 4, "aggregate": 1}
    fixed = planned_jobs(study, res, 2)  # fixed packs keep train.steps in the key: two jobs of two
    assert [j.target for j in fixed if j.kind == "pack"] == ["s0-n10,s1-n10", "s0-n30,s1-n30"]
    # the workflow plans the same jobs (both read lorarl.pack.hosting.hosting_plan: tests/pack/test_pack_hosting.py)
    assert plan_pack_jobs(cells, 2, 0) == [["s0-n10", "s1-n10"], ["s0-n30", "s1-n30"]]
    # cells that cannot pack (adapter dropout > 0) train alone, each its own job
    study, res = mixed(tmp_path / "drop", monkeypatch, adapter={"method": "lora", "dropout": 0.1})
    jobs = planned_jobs(study, res, 1, places=2)
    assert rule_counts(jobs)["train"] == 4 and "train_pack" not in rule_counts(jobs)


def test_pack_steps_of_the_planned_jobs_resident_against_fixed(tmp_path, monkeypatch):
    study, res = mixed(tmp_path, monkeypatch)
    cells = study_cells(study)
    two = pack_steps(cells, planned_jobs(study, res, 1, places=2), 1, 2)
    # 2 places over 10, 30, 10, 30: [10, 30] -> at 10 the next 10 (ends 20) -> at 20 the last 30 (ends 50); fixed
    # packs of 2 (lengths apart): 10 + 30
    assert two == {"resident": True, "places": 2, "max_cells": 2, "pack_steps": 50, "fixed_pack_steps": 40,
                   "solo_steps": 80, "jobs": [{"job": pack_id([c.id for c in cells], resident=True), "members": 4,
                                               "pack_steps": 50, "packs_formed": 3, "fixed_pack_steps": 40}]}
    four = pack_steps(cells, planned_jobs(study, res, 1, places=4), 1, 4)
    assert (four["pack_steps"], four["fixed_pack_steps"], four["jobs"][0]["packs_formed"]) == (30, 40, 1)
    assert pack_steps(cells, planned_jobs(study, res, 4, places=2), 4, 2)["max_cells"] == 4  # fixed packs of K
    fixed = pack_steps(cells, planned_jobs(study, res, 2), 2, 0)
    assert not fixed["resident"] and fixed["pack_steps"] == fixed["fixed_pack_steps"] == 40
    assert pack_steps(cells, planned_jobs(study, res), 1, 0) is None  # packing off
    line = describe(two)
    assert "Resident packs, 2 places: 1 train_pack job (3 packs formed)" in line
    assert "50 pack-steps resident against 40 in fixed packs of 2**, 1.25x (80 steps as solo cells)" in line
    assert describe(fixed).startswith("Fixed packs of at most 2: 2 train_pack jobs, 40 pack-steps (80 steps as solo")


@pytest.mark.parametrize("order, want", [(("seed", "len"), (180, 7, 160)), (("len", "seed"), (160, 4, 160))])
def test_the_docs_example_sixteen_cells_of_20_and_60_steps(tmp_path, monkeypatch, order, want):
    """docs/gpus.md "Packs": alternating lengths (the benchmark's order) 180 resident against 160 in fixed packs of 4
    (lengths apart); short cells first, 160 both."""
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    spec = {"seed": {"field": "seed", "prefix": "s", "values": list(range(8))},
            "len": {"field": "train.steps", "prefix": "n", "values": [20, 60]}}
    study = _study(tmp_path, {k: spec[k] for k in order})
    p = pack_steps(study_cells(study), planned_jobs(study, tmp_path / "results", 1, places=4), 1, 4)
    assert (p["pack_steps"], p["jobs"][0]["packs_formed"], p["fixed_pack_steps"]) == want
    assert p["jobs"][0]["members"] == 16 and p["solo_steps"] == 640


def test_projection_of_a_resident_job_one_start_up_and_the_members_steps(tmp_path, monkeypatch):
    from lorarl.pipeline.doctor.projection import project
    from lorarl.pipeline.doctor.report import render_markdown

    study, res = mixed(tmp_path, monkeypatch)
    cells = study_cells(study)
    prof = {"name": "default", "launcher": "slurm", "jobs": 8, "slurm": {}, "pack": {"resident": True, "places": 2}}
    m = measurements({})
    p = project(study, cells[0], m, prof, str(res))
    assert p["jobs"] == {"train_pack": 1, "train": 4, "evaluate": 5, "diagnose": 4, "aggregate": 1}
    launched = 2.0 + (101 - 100) + 1.0 + 0.5 + (153 - 150)
    model = launched + 10.0 + 4.0 + (3.0 - 1.0)
    step = 1.2 + 0.5  # the smoke's scoring + forward/backward (beta 0: no reference forward)
    smoke_fixed = 2.0 + 10 * 2.0 - 10 * step  # what the smoke's 10-step training spent beside its steps
    # one start-up (+ the reward regime, the smoke's fixed part), then the members' 80 steps; 4 publish launchers
    assert p["train_h"] * 3600 == pytest.approx(model + 1.0 + smoke_fixed + 80 * step + 4 * 2.0)
    assert p["pack_places"] == 2 and p["packs"]["pack_steps"] == 50 and p["places_refused"] == []
    fixed = project(study, cells[0], m, {**prof, "pack": {"max_cells": 2}}, str(res))
    assert fixed["jobs"]["train_pack"] == 2
    assert fixed["train_h"] * 3600 == pytest.approx(p["train_h"] * 3600 + model + 1.0 + smoke_fixed)  # a 2nd start-up
    assert "lengths aside" in p["assumptions"][0] and "re-forms at its slot boundaries not charged" in \
        " ".join(p["assumptions"])
    rep = {"study": "jobs", "cell": cells[0].id, "ok": True, "profile": prof, "projection": p,
           "measured": {**m, "split": {**m["split"], "rollout_tokens_per_s": 50.0}, "evaluation": {}, "checks": [], "steps": 3, "device": {"kind": "cpu", "name": "cpu", "count": 1,
                                                                   "memory_gb": 8.0, "driver": "-", "cuda": "-",
                                                                   "torch": "-"}}}
    assert describe(p["packs"]) in render_markdown(rep)
    # `lorarl status --watch` plans the doctor's jobs again (lorarl.pipeline.progress.eta): the resident job, with its seconds
    from lorarl.pipeline.progress.eta import study_eta

    (res / "jobs" / "doctor").mkdir(parents=True)
    (res / "jobs" / "doctor" / "doctor.json").write_text(json.dumps({"projection": p}))
    eta = study_eta(study, res, [], None)
    assert eta["jobs_left"]["pack"] == 1 and not eta["lower_bound"]
    assert eta["eta_s"] == pytest.approx(p["wall_h"] * 3600 - sum(p["scheduler"]))  # less Snakemake's start


def test_the_memory_plan_checks_each_resident_jobs_places():
    from lorarl.memory.resident import admitted_places
    from lorarl.language.study import load_study

    study = load_study(ROOT / "experiments" / "peft_zoo.yaml")
    lora = [c for c in study_cells(study) if c.config.adapter.method == "lora"][:8]
    ids = [c.id for c in lora]
    job = [PlannedJob("pack", pack_id(ids), ",".join(ids))]
    most, _ = admitted_places([c.config for c in lora], 80.0, 4)
    assert 1 <= most < len(lora)
    assert places_refused(lora, job, most, 80.0) == []
    refused = places_refused(lora, job, most + 1, 80.0)
    assert len(refused) == 1 and f"pack.places = {most + 1}" in refused[0] and f"allowed: 1..{most}" in refused[0]
    assert places_refused(lora, job, most + 1, 0.0) == []  # a CPU: nothing to check
    # the report's check: failed with the job's refusal on a GPU; none on a CPU or without resident packs
    check = places_check({"pack_places": most + 1, "places_refused": refused}, "cuda")
    assert not check["ok"] and check["detail"] == refused[0]
    assert places_check({"pack_places": most, "places_refused": []}, "cuda")["ok"]
    assert places_check({"pack_places": most + 1, "places_refused": []}, "cpu") is None
    assert places_check({"pack_places": 0, "places_refused": []}, "cuda") is None
