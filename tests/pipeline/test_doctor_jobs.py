"""The doctor's job list and schedule (lorarl.pipeline.doctor.jobs), the CPUs a session gets on a shared machine
(lorarl.pipeline.doctor.clock.share), each job's cost from the doctor's measurements (lorarl.pipeline.doctor.costs)
and the whole projection's arithmetic on hand-made measurements. The projection against a real Snakemake run:
tests/project/test_pipeline.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lorarl.pipeline.doctor.clock import share
from lorarl.pipeline.doctor.jobs import (START_PRIORITY, PlannedJob, job_kinds, machine_rate, makespan, planned_jobs,
                                         rule_counts, wall_under)
from lorarl.pipeline.jobs.stages import STAGES
from lorarl.language.study import study_cells
from tests.support.doctor import _study, measurements

ROOT = Path(__file__).resolve().parents[2]


def test_rule_threads_and_names_are_the_workflow_rules():
    rules = {}
    for f in (ROOT / "workflow" / "rules").glob("*.smk"):
        for name, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", f.read_text(), re.M):
            m = re.search(r"^\s+threads: (\d+)", body, re.M)
            rules[name] = int(m.group(1)) if m else 1  # Snakemake's default
    assert job_kinds() == {"base", "train", "pack", "publish", "evaluate", "diagnose", "aggregate"}
    for kind in job_kinds():  # each kind's rule and threads: its stage's registry entry (publish: train's)
        job = PlannedJob(kind, "c")
        assert rules[job.rule] == job.threads, kind
    assert {r for s in STAGES.values() for r in (s.step_rule, s.rung_rule) if r} == {"evaluate_step", "train_rung"}
    assert {r for s in STAGES.values() for r in (s.step_rule, s.rung_rule) if r} <= set(rules)
    assert (PlannedJob("evaluate", "c", "math500@20").rule, PlannedJob("publish", "c", "until=8").rule) == (
        "evaluate_step", "train_rung")


def test_each_kind_is_timed_by_its_registry_entry():
    """The doctor's cost model and the watch's ETA read a planned job's timing off its kind's entry (a stage's,
    or the doctor's own for publish and aggregate): every kind names a measured part the cost model knows."""
    from lorarl.pipeline.doctor.costs import WORK

    timing = {k: PlannedJob(k, "c").timing for k in job_kinds()}
    assert {k: t.cost for k, t in timing.items()} == {
        "base": "build", "train": "training", "pack": "training", "publish": "launcher", "evaluate": "evaluation",
        "diagnose": "diagnostics", "aggregate": "aggregate"}
    assert {t.cost for t in timing.values()} == set(WORK)
    assert [k for k, t in timing.items() if t.by_steps] == ["train"]  # the ETA counts a cell's steps left
    assert sorted(k for k, t in timing.items() if t.of_cell) == ["publish", "train"]
    assert [k for k, t in timing.items() if t.keeps_going] == ["aggregate"]
    assert sorted(k for k, t in timing.items() if not t.mean_timed) == ["pack", "publish", "train"]


def test_planned_jobs_are_the_rules_jobs_and_skip_what_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    axes = {"seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}}
    study = _study(tmp_path, axes, eval={"eval_every": 5, "benchmarks": {"synthetic": {}}})
    res = tmp_path / "results"
    jobs = planned_jobs(study, res)
    # 1 base model; 3 cells: train, final evaluation + a snapshot's at step 5 (the last step's is the final),
    # diagnose; the base pseudo-cell's final evaluation; one aggregation that waits for everything
    assert rule_counts(jobs) == {"base_model": 1, "train": 3, "evaluate": 4, "evaluate_step": 3, "diagnose": 3,
                                 "aggregate": 1}
    by = {j.key: j for j in jobs}
    assert by["evaluate:s0:synthetic@5"].after == ("train:s0:",) and by["train:s0:"].after == ("base:tiny-test:",)
    assert by["evaluate:base:synthetic"].after == ("base:tiny-test:",) and by["evaluate:base:synthetic"].base
    assert set(by["aggregate:jobs:"].after) == set(by) - {"aggregate:jobs:"}
    # what exists is not run again: the base model, cell s0 (its summary of this config), its final evaluation
    (res / "models" / "tiny-test").mkdir(parents=True)
    (res / "models" / "tiny-test" / "config.json").write_text("{}")
    s0 = study_cells(study)[0]
    (res / "jobs" / "s0" / "eval").mkdir(parents=True)
    (res / "jobs" / "s0" / "summary.json").write_text(json.dumps({"config_hash": s0.hash}))
    (res / "jobs" / "s0" / "eval" / "synthetic.json").write_text("{}")
    jobs = planned_jobs(study, res)
    assert rule_counts(jobs) == {"train": 2, "evaluate": 3, "evaluate_step": 3, "diagnose": 3, "aggregate": 1}
    assert {j.key for j in jobs if j.cell == "s0"} == {"evaluate:s0:synthetic@5", "diagnose:s0:"}
    # packs of 2: one train_pack job; each member's own train job waits in a slot for it (lorarl.pack.publish)
    jobs = planned_jobs(study, res, pack_max_cells=2)
    counts = rule_counts(jobs)
    assert counts["train_pack"] == 1 and counts["train"] == 2
    pack = next(j for j in jobs if j.kind == "pack")
    assert pack.target == "s1,s2" and {j.holds for j in jobs if j.kind == "publish"} == {pack.key}


def _jobs(*spec) -> list[PlannedJob]:
    return [PlannedJob(kind, cell, after=tuple(after), holds=holds) for kind, cell, after, holds in spec]


def test_makespan_schedules_slots_dependencies_threads_and_a_shared_machine():
    a, b, c = _jobs(("train", "a", (), ""), ("train", "b", (), ""), ("diagnose", "a", ["train:a:"], ""))
    secs = {"train:a:": 10.0, "train:b:": 10.0, "diagnose:a:": 5.0}
    cost = lambda j: (0.0, secs[j.key])  # noqa: E731 - waits only: no CPU sharing
    assert makespan([a, b, c], cost, slots=2) == pytest.approx(15.0)
    assert makespan([a, b, c], cost, slots=1) == pytest.approx(25.0)
    base = PlannedJob("base", "m")  # 2 threads: alone on 2 slots, then the two trainings side by side
    secs[base.key] = 4.0
    assert makespan([base, a, b], cost, slots=2) == pytest.approx(14.0)
    assert makespan([base, a, b], cost, slots=4, count_threads=False) == pytest.approx(10.0)  # Slurm: a slot a job
    # a shared machine: CPU work stretches by the per-thread rate of the threads running, waits do not
    cpu = lambda j: (secs[j.key], 0.0)  # noqa: E731
    one_cpu = machine_rate({"capacity": {"1": 1.0, "2": 1.0}})  # our session gets one CPU however many jobs
    assert one_cpu(1) == 1.0 and one_cpu(2) == 0.5 and one_cpu(5) == 0.2 and machine_rate(None)(3) == 1.0
    assert makespan([a, b], cpu, 2, one_cpu) == pytest.approx(20.0)  # two jobs at half speed
    assert makespan([a, b], cpu, 2, machine_rate({"capacity": {"1": 1.0, "2": 2.0}})) == pytest.approx(10.0)
    mixed = {"train:a:": (5.0, 5.0), "train:b:": (5.0, 5.0)}
    assert makespan([a, b], lambda j: mixed[j.key], 2, one_cpu) == pytest.approx(15.0)  # 5 / 0.5 + 5
    # a pack member's train job holds a slot until its pack ends, then takes its own time
    p, m1, m2 = _jobs(("pack", "p", (), ""), ("publish", "x", (), "pack:p:"), ("publish", "y", (), "pack:p:"))
    secs.update({"pack:p:": 10.0, "publish:x:": 1.0, "publish:y:": 1.0})
    assert makespan([m1, m2, p], cost, slots=2) == pytest.approx(11.0)  # pack first, x waits beside it; x, y after
    # Snakemake's priorities (workflow/rules: pack 100, a packed member's train job 50, the rest 0): a member's
    # train job starts before an evaluation listed (and ready) before it, so it publishes when its pack ends
    ev = PlannedJob("evaluate", "z", "synthetic")
    secs[ev.key] = 5.0
    assert START_PRIORITY["pack"] > START_PRIORITY["publish"] > START_PRIORITY.get("evaluate", 0) == 0
    assert makespan([ev, m1, p], cost, slots=2) == pytest.approx(15.0)  # p + x, the evaluation when p ends (11 before)
    assert makespan([ev, p], cost, slots=2) == pytest.approx(10.0)  # beside the pack when no member waits
    # jobs already running go first, with what is left of them, and run once (a running job that the plan has
    # waiting for another is not started again when that one ends)
    assert makespan([a, b, c], cost, slots=1, started={"train:b:": 0.0}) == pytest.approx(25.0)
    assert makespan([a, c], cost, slots=1, started={"diagnose:a:": 0.5}) == pytest.approx(2.5 + 10.0)
    loop = [PlannedJob("train", "a", after=("diagnose:a:",)), PlannedJob("diagnose", "a", after=("train:a:",))]
    with pytest.raises(ValueError, match="never runs"):
        makespan(loop, cost, slots=1)


def test_a_session_gets_its_fair_share_of_the_cpus():
    # four other sessions with a runnable thread each, 2 CPUs: ours gets 2/5 of them however many threads it runs
    others = [(1.0, 1)] * 4
    assert share(1, 2, others, per_thread=False) == pytest.approx(0.4)
    assert share(3, 2, others, per_thread=False) == pytest.approx(0.4)
    assert share(2, 2, others, per_thread=True) == pytest.approx(2 * 2 / 6)  # no autogroups: thread by thread
    assert share(1, 2, [], False) == 1.0 and share(2, 2, [], False) == 2.0  # idle: a CPU per thread
    assert share(2, 2, [(1.0, 1)], False) == pytest.approx(1.0)  # the other session's one thread takes one CPU
    assert share(2, 2, [(1.0, 8)], False) == pytest.approx(1.0) and share(0, 2, [], False) == 0.0
    assert share(1, 2, [(1.25 ** -5, 1)] * 2, False) == pytest.approx(1.0)  # niced sessions weigh less
    # two runnable threads of our own session that are not the study's (e.g. another test process): the session's
    # 2/5 of the CPUs split between them and the study's thread
    assert share(1, 2, others, per_thread=False, mates=2) == pytest.approx(0.4 / 3)
    assert share(2, 2, [], per_thread=False, mates=2) == pytest.approx(1.0)  # alone: 2 CPUs over 4 threads


def test_projection_arithmetic_on_hand_made_measurements(tmp_path, monkeypatch):
    from lorarl.pipeline.doctor.projection import project

    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    study = _study(tmp_path, {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}})
    res = tmp_path / "results"
    (res / "models" / "tiny-test").mkdir(parents=True)
    (res / "models" / "tiny-test" / "config.json").write_text("{}")  # built: no base model job
    smoke = study_cells(study)[0]
    prof = {"name": "default", "launcher": "local", "jobs": 2, "slurm": {}}
    half_cpu = {"cores": 2, "capacity": {"1": 0.5, "2": 0.5}}  # our session got half a CPU, alone or not
    p = project(study, smoke, measurements(half_cpu), prof, str(res))
    launched = 2.0 + (101 - 100) + 1.0 + 0.5 + (153 - 150)  # launcher, submit, job process, study table, teardown
    model = launched + 10.0 + 4.0 + (3.0 - 1.0)  # + imports, MLflow store, first load less a warm one
    train = model + 1.0 + 2.0 + 10 * 2.0  # + reward regime, the smoke's fixed part, 10 steps of 2 s
    evaluate = model + 1.0 + (3.5 - 1.0 - 0.5) + 8 * 0.5  # + load, the first problem's extra, 8 problems
    diagnose = model + 4.0
    assert p["jobs"] == {"train": 2, "evaluate": 3, "diagnose": 2, "aggregate": 1}
    assert p["startup"]["per launched job"] == pytest.approx(launched)
    assert p["train_h"] * 3600 == pytest.approx(2 * train) and p["eval_h"] * 3600 == pytest.approx(3 * evaluate)
    assert p["diagnostics_h"] * 3600 == pytest.approx(2 * diagnose) and p["aggregate_h"] * 3600 == pytest.approx(6.0)
    serial = 5.0 + 2 * train + 3 * evaluate + 2 * diagnose + 6.0  # Snakemake's start (its dry run), the jobs
    assert p["serial_h"] * 3600 == pytest.approx(serial)
    # half a CPU for the session whatever runs: two jobs side by side each go at a quarter, nothing is won
    assert p["wall_h"] * 3600 == pytest.approx(serial)
    # the same jobs on an idle 2-CPU machine: each job's CPU seconds (half its measured wall) at full speed,
    # two at a time: the trainings; s0's evaluation and diagnostics, each followed by one of s1's; the base's
    # evaluation alone (it was ready from the start, but later in the rules' order); the aggregation
    t, e, d = train / 2, evaluate / 2, diagnose / 2
    assert p["wall_idle_h"] * 3600 == pytest.approx(2.5 + t + d + e + e + 3.0)
    assert wall_under(p, {"cores": 2, "capacity": {"1": 1.0, "2": 2.0}}) == pytest.approx(p["wall_idle_h"] * 3600)
    assert wall_under(p, half_cpu) == pytest.approx(serial)
    text = "\n".join(p["assumptions"])
    assert "its session got 0.50 CPUs with one runnable thread and 0.50 with two" in text
    # a Slurm profile: jobs do not share a machine, each takes its measured time, 2 at a time
    # a sqlite store's schema check is what each job pays to open the store; its creation, the first job only
    m = measurements(half_cpu)
    m["phases"]["mlflow_open"] = {"wall_s": 3.0, "cpu_s": 1.5}
    once = project(study, smoke, m, prof, str(res))
    assert once["serial_h"] * 3600 == pytest.approx(serial - 7 * (4.0 - 3.0) + 4.0)
    assert once["train_h"] * 3600 == pytest.approx(2 * (train - 1.0) + 4.0)
    (res / "mlflow.db").write_text("")  # the study's store exists already: nobody creates it
    assert project(study, smoke, m, prof, str(res))["serial_h"] * 3600 == pytest.approx(serial - 7 * 1.0)
    slurm = project(study, smoke, measurements(half_cpu), {**prof, "launcher": "slurm"}, str(res))
    assert slurm["serial_h"] == pytest.approx(p["serial_h"]) and not slurm["shared_machine"]
    assert slurm["wall_h"] * 3600 == pytest.approx(5.0 + train + diagnose + evaluate + evaluate + 6.0)


WAIT_CASES = [  # (recorded jobs: stage, folder, wait s), the projection's figure that grows, by how much
    ([], None, 0.0),
    ([("train", "s0", 2.0), ("train", "s1", 4.0)], "train_h", 2 * 3.0),  # 2 train jobs x the mean 3 s
    ([("evaluate", "s0", 1.5)], "eval_h", 3 * 1.5),  # 2 cells' and the base's evaluations
    ([("diagnose", "s1", 2.0)], "diagnostics_h", 2 * 2.0),
    ([("aggregate", ".aggregate", 5.0)], "aggregate_h", 5.0),
    ([("doctor", "doctor", 100.0)], None, 0.0),  # not a job the study runs: its smoke's wait is not charged
]


@pytest.mark.parametrize("recorded,figure,grows", WAIT_CASES)
def test_projection_charges_each_job_its_kinds_recorded_waits(tmp_path, monkeypatch, recorded, figure, grows):
    """Waits on a lock, a claim or a decision (the cost ledger's wait phase of the study's recorded jobs): each job of
    a kind is charged its kind's mean, as wait seconds (no CPU); the projection grows by exactly that."""
    from lorarl.pipeline.doctor.projection import project

    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    study = _study(tmp_path, {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}})
    res = tmp_path / "results"
    (res / "models" / "tiny-test").mkdir(parents=True)
    (res / "models" / "tiny-test" / "config.json").write_text("{}")
    smoke, prof = study_cells(study)[0], {"name": "default", "launcher": "slurm", "jobs": 1, "slurm": {}}
    before = project(study, smoke, measurements({}), prof, str(res))
    for i, (stage, folder, wait) in enumerate(recorded):
        d = res / "jobs" / folder / "cost"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stage}-{i}.json").write_text(json.dumps({"schema": 1, "stage": stage, "phases_s": {"wait": wait,
                                                                                                 "other": 9.0}}))
    after = project(study, smoke, measurements({}), prof, str(res))
    assert after["serial_h"] * 3600 == pytest.approx(before["serial_h"] * 3600 + grows)
    assert after["wall_h"] * 3600 == pytest.approx(before["wall_h"] * 3600 + grows)  # one slot: the jobs in turn
    for key in ("train_h", "eval_h", "diagnostics_h", "aggregate_h"):
        assert after[key] * 3600 == pytest.approx(before[key] * 3600 + (grows if key == figure else 0.0)), key
    kind = {"train_h": "train", "eval_h": "evaluate", "diagnostics_h": "diagnose", "aggregate_h": "aggregate"}.get(figure)
    for a, b in zip(after["schedule"], before["schedule"]):  # not on the CPU
        assert a["cpu_s"] == pytest.approx(b["cpu_s"]) and a["wait_s"] == pytest.approx(
            b["wait_s"] + (grows / sum(r["kind"] == kind for r in before["schedule"]) if a["kind"] == kind else 0.0))
    text = "\n".join(after["assumptions"])
    assert ("none recorded: 0 s" in text) == (kind is None)
    assert set(after["waits"]) == ({kind} if kind else set())


def test_job_stats_of_a_snakemake_log():
    from lorarl.pipeline.doctor.jobs import parse_job_stats

    log = ("Building DAG of jobs...\nJob stats:\njob          count\n---------  -------\nevaluate         3\n"
           "train            2\naggregate        1\nall              1\ntotal            7\n\nSelect jobs to execute...\n")
    assert parse_job_stats(log) == {"evaluate": 3, "train": 2, "aggregate": 1} and parse_job_stats("nothing") == {}
