"""A resident job (lorarl.pack.resident) as a job: SIGKILLed mid-run, its rerun resumes every member from its last
checkpoint and each ends equal to its solo run; the Snakemake config's `pack: {resident: true, places: P}` is
checked before anything runs (exit 2, the field and the allowed values named, nothing written), extends the
default config from the command line, and plans one job per compatible group, lengths aside: the jobs `lorarl doctor`
projects (lorarl.pipeline.doctor.jobs). Through Snakemake end to end (the job SIGKILLed, `snakemake all` again,
`--forcerun` of one cell): tests/pack/test_resident_snakemake.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.pause import outputs
from tests.support.resident import assert_equal_runs, published, resident_cells, solo_runs
from tests.support.snakemake import run_snakemake

REPO = Path(__file__).resolve().parents[2]

KILLED_JOB = """
import sys
from lorarl.pack import build
from lorarl.rewards.outcome import OutcomeDeposits, settings_of
from tests.support.grpo import fake_score
from tests.support.pack_steps import fake_regimes
real = build.build_pack
build.build_pack = lambda *a, **kw: fake_regimes(real(*a, **kw))
import lorarl.train.prepare as prepare
prepare.reward_of = lambda cfg, *a, **kw: (OutcomeDeposits(score_fn=fake_score), settings_of(cfg.reward))
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.pipeline.jobs.launch import run_stage
run_stage("pack", sys.argv[1], sys.argv[2], sys.argv[3], threads=1,
          params=JobParams(places=int(sys.argv[4]), pack_id=sys.argv[5]))
"""


@pytest.mark.slow
def test_a_sigkilled_resident_job_resumes_every_member_equal_to_solo(tiny_dir, tmp_path, fake_rewards):
    from lorarl.pack.plan import pack_id
    from lorarl.pipeline.jobs.jobparams import JobParams
    from lorarl.pipeline.jobs.launch import run_stage

    cells = resident_cells(tmp_path, tiny_dir, steps=(2, 4), collapse=(False, True), checkpoint_every=1)
    a, b, c = cells["s2-cFalse"], cells["s4-cFalse"], cells["s4-cTrue"]
    study = str(tmp_path / "rz.yaml")
    order = [a, b, c]
    ids, res, ref = ",".join(x.id for x in order), tmp_path / "res", tmp_path / "ref"
    env = {**os.environ, "LORARL_FAULT": "kill_at_step:3", "LORARL_LOCK_WAIT_S": "0",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rid = pack_id(ids.split(','), resident=True)  # the plan's id (pack.smk passes it as --pack-id)
    first = subprocess.run([sys.executable, "-c", KILLED_JOB, study, ids, str(res), "2", rid], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    # a finished at 2 (staged); b paused at 2 (the slot boundary: a checkpoint) and was killed at its step 3
    assert (res / "rz" / a.id / ".packed" / "summary.json").exists()
    ckpts = res / "rz" / ".checkpoints"
    assert sorted(p.name for p in (ckpts / b.id).glob("checkpoint-*")) == ["checkpoint-2"]
    out = run_stage("pack", study, ids, str(res), threads=1, params=JobParams(places=2, pack_id=rid))  # the rerun
    assert out["trained"] == sorted([b.id, c.id]) and a.id in out["left_out"]  # a: staged already
    assert json.loads((res / "rz" / ".packs" / f"{rid}.json").read_text())["resident"] == 2
    segs = json.loads((res / "rz" / ".packs" / f"{rid}.ledger.json").read_text())["segments"]
    # the killed process's two admissions are kept; the rerun's (run 1) are appended
    assert [(s["run"], s["admitted"]) for s in segs] == [(0, [a.id, b.id]), (0, [b.id, c.id]), (1, [b.id, c.id])]
    published(res, order)
    solo = solo_runs(ref, order)
    assert solo[c.id]["stopped_on_collapse"] == 3  # its frac_truncated flag with train.stop_on_collapse
    for x in order:
        got = outputs(res / "rz" / x.id)
        assert_equal_runs(got, outputs(ref / "rz" / x.id), resumed_from=None, steps=solo[x.id]["steps"])
    assert outputs(res / "rz" / b.id)[2]["resumed_from_steps"][-1] == 2  # lost only its step 3


def snakemake_dry(workdir: Path, pack: dict, *args: str) -> subprocess.CompletedProcess:
    (workdir / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(workdir / "rz.yaml")], "results": "results", "launcher": "local", "slurm": {}, "pack": pack}))
    return run_snakemake(workdir, "-n", "all", *args, cores=1, check=False)


@pytest.mark.parametrize("pack, field", [
    ({"max_cells": 4, "resident": True}, "pack.places must be an integer >= 1"),
    ({"max_cells": 4, "resident": True, "places": 0}, "pack.places must be an integer >= 1"),
    ({"max_cells": 1, "resident": True, "places": 2}, "pack.resident: true needs packing"),
    ({"max_cells": 2, "resident": True, "places": 3}, "allowed: 1..2"),
    ({"max_cells": 4, "places": 2}, "needs pack.resident: true"),
    ({"resident": "maybe", "places": 2}, "pack.resident must be true or false"),
])
def test_bad_resident_settings_are_refused(pack, field):
    from lorarl.pack.plan import resident_places

    with pytest.raises(ValueError, match="pack\\.") as err:
        resident_places(pack)
    assert field in str(err.value)


@pytest.mark.parametrize("defaults", ["config/config.yaml", "profiles/slurm/cluster.yaml"])
def test_resident_settings_on_the_command_line_extend_the_default_config(defaults):
    """`--config 'pack={resident: true, places: 2}'` as docs/packed.md gives it: Snakemake merges a mapping into
    the configfile's `pack` key by key, so a default written `{max_cells: 1}` made it `resident with packing off`
    (refused); the shipped defaults say `pack: 1`, which a mapping replaces."""
    from snakemake.utils import update_config

    from lorarl.pack.plan import max_cells, resident_places

    config = yaml.safe_load((REPO / defaults).read_text())
    assert max_cells(config["pack"]) == 1 and resident_places(config["pack"]) == 0  # packing off by default
    update_config(config, {"pack": {"resident": "true", "places": "2"}})  # as Snakemake parses the --config value
    assert resident_places(config["pack"]) == 2


def test_snakemake_refuses_bad_places_and_plans_one_resident_job_per_group(tiny_dir, tmp_path):
    """Bad pack settings exit 2 at parse, before any job, naming the field and the allowed values: a bad count, an
    unknown key (the schema used to dump itself, exit 1, never naming it), places the memory plan refuses on the
    jobs' GPU (used to be refused only inside the job, its members then trained elsewhere). The jobs' command lines
    carry their parameters as arguments, no environment variable."""
    resident_cells(tmp_path, tiny_dir, steps=(2, 4), collapse=(False, True))
    for pack, said in (({"max_cells": 4, "resident": True, "places": 0}, "pack.places must be an integer >= 1"),
                       ({"resident": True, "place": 2}, "unknown key(s) pack.place (did you mean pack.places?); "
                                                        "allowed: pack.max_cells, pack.update_cells, pack.resident, "
                                                        "pack.places, pack.gpu_memory_gb"),
                       ({"resident": True, "places": 2, "gpu_memory_gb": 0.001},
                        "pack.places = 2: the memory plan admits at most 0 places on a 0.001 GiB GPU")):
        bad = snakemake_dry(tmp_path, pack)
        assert bad.returncode == 2, bad.stderr[-2000:]
        assert said in bad.stderr and "allowed: " in bad.stderr, bad.stderr[-2000:]
        assert not (tmp_path / "results").exists()
    good = snakemake_dry(tmp_path, {"resident": True, "places": 2, "gpu_memory_gb": 80}, "--quiet", "host",
                         "--printshellcmds")  # each job's block and command; the tiny cells fit an 80 GiB GPU
    assert good.returncode == 0, good.stderr[-3000:]
    assert re.search(r"\btrain_pack\s+1\n", good.stdout + good.stderr), good.stderr[-3000:]  # one job, two lengths
    cmds = [line for line in (good.stdout + good.stderr).splitlines() if "lorarl launch" in line]
    assert cmds and not [c for c in cmds if "LORARL_" in c], cmds  # job parameters as arguments
    assert [c for c in cmds if "launch pack" in c and "--places=2 " in c and "--attempt=1 " in c], cmds
    assert all("--invocation=" in c for c in cmds), cmds
    fixed = snakemake_dry(tmp_path, {"max_cells": 2}, "--quiet", "host")  # train.steps in the fixed key: two jobs
    assert re.search(r"\btrain_pack\s+2\n", fixed.stdout + fixed.stderr), fixed.stderr[-3000:]
    # the doctor's plan (lorarl.pipeline.doctor.jobs) is Snakemake's: the same jobs, the same pack ids
    from lorarl.pipeline.doctor.jobs import parse_job_stats, planned_jobs, rule_counts
    from lorarl.language.study import load_study

    study = load_study(tmp_path / "rz.yaml")
    for run, setting in ((good, (1, 2)), (fixed, (2, 0))):
        plan = planned_jobs(study, tmp_path / "results", *setting)
        assert parse_job_stats(run.stdout + run.stderr) == rule_counts(plan), setting
        packs = set(re.findall(r"\.packs/(pack-[0-9a-f]{10})\.json", run.stdout + run.stderr))
        assert packs == {j.cell for j in plan if j.kind == "pack"}, setting


def test_the_memory_plan_caps_the_places():
    """The plan of a resident job is its largest K-member mix; more places than the GPU admits are refused."""
    from lorarl.memory.resident import admitted_places, mix_peak_gb
    from lorarl.pack.resident import check_places
    from lorarl.language.study import load_study, study_cells

    study = load_study(REPO / "experiments" / "peft_zoo.yaml")
    cfg = next(c.config for c in study_cells(study) if c.config.adapter.method == "lora")
    cfgs = [cfg] * 16
    most, _ = admitted_places(cfgs, 80.0, 4)
    assert 1 <= most < 16
    assert mix_peak_gb(cfgs, most, 80.0) <= 0.9 * 80 < mix_peak_gb(cfgs, most + 1, 80.0)
    assert mix_peak_gb(cfgs, 2, 80.0) > mix_peak_gb(cfgs, 1, 80.0)  # each member adds its own part
    assert check_places(most, cfgs, gpu_memory_gb=80.0) == most
    with pytest.raises(ValueError, match=f"pack.places = {most + 1}.*allowed: 1..{most}"):
        check_places(most + 1, cfgs, gpu_memory_gb=80.0)


def test_a_resident_rung_job_writes_the_rules_record(tiny_dir, tmp_path, fake_rewards):
    """A rung's pack job (its --until, resident or fixed) is named with its rung in workflow/rules/pack.smk:
    the job writes that record (the rule's output), and each member's rung mark, staged."""
    from lorarl.pack.plan import pack_id
    from lorarl.pipeline.jobs.jobparams import JobParams
    from lorarl.pipeline.jobs.launch import run_stage

    cells = resident_cells(tmp_path, tiny_dir, steps=(2, 4), collapse=(False,))
    ids = sorted(cells)
    rid = pack_id(ids, until=1, resident=True)  # the plan's id, the job's --pack-id: its record and ledger
    out = run_stage("pack", str(tmp_path / "rz.yaml"), ",".join(ids), str(tmp_path / "res"), threads=1,
                    params=JobParams(places=1, until=1, pack_id=rid))
    record = json.loads((tmp_path / "res" / "rz" / ".packs" / f"{rid}.json").read_text())
    assert record["states"] == out["states"] == {c: "paused" for c in ids} and record["resident"] == 1
    segs = json.loads((tmp_path / "res" / "rz" / ".packs" / f"{rid}.ledger.json").read_text())["segments"]
    assert [s["admitted"] for s in segs] == [[ids[0]], [ids[1]]]  # one place: the first paused at its rung, freed it


def test_a_resident_job_refuses_more_places_than_its_gpu_admits(tmp_path, monkeypatch, capsys):
    """On the job's GPU (here: said to be 80 GiB), before any cell is claimed: exit 2, the field and the allowed values."""
    from types import SimpleNamespace

    from lorarl.memory.resident import admitted_places
    from lorarl.pack import resident
    from lorarl.language.study import load_study, study_cells

    study = load_study(REPO / "experiments" / "peft_zoo.yaml")
    cfg = next(c.config for c in study_cells(study) if c.config.adapter.method == "lora")
    cells = [SimpleNamespace(id=f"c{i}", config=cfg) for i in range(16)]
    most, _ = admitted_places([cfg] * 16, 80.0, 4)
    monkeypatch.setattr(resident, "_gpu_memory_gb", lambda: 80.0)
    with pytest.raises(SystemExit) as err:
        resident.train_resident("zoo", cells, tmp_path / "res", places=most + 1)
    assert err.value.code == 2 and not (tmp_path / "res").exists()
    assert f"pack.places = {most + 1}" in capsys.readouterr().err
