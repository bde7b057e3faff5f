"""`lorarl doctor`: end to end on the demo study through the local launcher (CPU), a failing check, bad input,
the step-time split and the projection arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lorarl.cli import main
from lorarl.pipeline.doctor.job import step_split, truncation
from lorarl.pipeline.doctor.projection import project
from lorarl.pipeline.doctor.report import smoke_study
from lorarl.language.study import load_study, study_cells
from tests.support.study import tiny_study

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "experiments" / "demo.yaml")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results folder whose `local:tiny-arith` base is a stand-in (random weights, a local tokenizer) so the
    test does not spend minutes on the base model's SFT; the doctor finds it and skips the base stage."""
    import torch

    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

    res = tmp_path_factory.mktemp("res")
    d = res / "models" / "tiny-arith"
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-*=?()\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    torch.manual_seed(0)
    model = build_tiny(TinyRecipe(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64), len(tok),
                       tok.eos_token_id, tok.pad_token_id)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return res


def test_smoke_study_is_one_cell_with_the_same_id_and_short_settings(results, tmp_path):
    study = load_study(DEMO)
    cell = study_cells(study)[3]
    raw = smoke_study(study, cell, steps=2, eval_limit=4, results_dir=str(results))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (only,) = study_cells(load_study(tmp_path / "s.yaml"))
    assert only.id == cell.id and only.config.train.steps == 2 and only.config.train.checkpoint_every == 0
    assert only.config.eval.benchmarks["synthetic"].limit == 4
    assert only.config.model == str((results / "models" / "tiny-arith").resolve())
    assert only.config.adapter == cell.config.adapter and only.config.train.beta == cell.config.train.beta


def test_truncation_is_the_share_of_the_smokes_completions_cut_at_the_cap(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,frac_truncated\n1,1.0\n2,0.5\n3,\n4,0.0\n")  # the warm-up step counts: its rollouts are real
    t = truncation(csv, 256)
    assert (t["share"], t["steps"], t["cap"]) == (0.5, 3, 256)
    assert t["detail"].startswith("50% of the smoke's completions (3 step(s)) reached max_completion_length 256")
    assert "most answers are cut" in t["detail"]
    csv.write_text("step,frac_truncated\n1,0.25\n")
    assert "most answers" not in truncation(csv, 786)["detail"]
    csv.write_text("step,reward\n1,1.0\n")
    assert truncation(csv, 786)["share"] is None


def test_step_split_and_projection_arithmetic(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,time/step_s,time/score_s,time/generate_s,time/reward_s,time/ref_forward_s,"
                   "time/kl_monitor_s,rollout/tokens\n"
                   "1,9,9,9,9,9,,9\n"  # warm-up: dropped
                   "2,2.0,1.2,1.0,0.1,0.3,,100\n3,2.0,1.2,1.0,0.1,0.3,0.5,100\n")
    sp = step_split(csv)
    assert sp["step_s"] == pytest.approx(2.0) and sp["rollout_generation_s"] == pytest.approx(1.0)
    assert sp["old_policy_forward_and_advantages_s"] == pytest.approx(0.1)
    assert sp["policy_forward_backward_s"] == pytest.approx(0.5) and sp["kl_monitor_per_run_s"] == pytest.approx(0.5)
    assert sp["rollout_tokens_per_s"] == pytest.approx(100.0)
    study = load_study(DEMO)
    cells = study_cells(study)
    m = {"split": sp, "model_load_s": 1.0, "diagnose_s": 3.0, "device": {"kind": "cuda"},
         "evaluation": {"synthetic": {"seconds_per_problem": 0.5, "problems": 4}}}
    smoke = next(c for c in cells if c.config.train.beta > 0)  # measured its reference forward (0.3 s)
    t = smoke.config.train
    # every demo cell has the same token budget; the 4 cells with beta 0 run no reference forward
    fixed_s = 8 * (1.0 + (t.steps // t.kl_monitor_every) * 0.5)  # model load + KL monitors: not split over ranks
    steps_s = 4 * t.steps * 2.0 + 4 * t.steps * 1.7
    eval_s = 9 * (1.0 + 0.5 * 200)  # 8 cells + 1 base, synthetic n_eval 200
    # 2 GPUs per node = 2 data-parallel ranks (ideal scaling: each step in half the time, on two GPUs);
    # tasks_per_node 1 = one process holding 2 GPUs (the step time of one rank, GPU-hours of two)
    for train, ranks in [({"gpus_per_node": 2}, 2), ({"gpus_per_node": 2, "tasks_per_node": 1}, 1)]:
        prof = {"name": "slurm", "launcher": "slurm", "jobs": 4, "slurm": {"train": train}}
        p = project(study, smoke, m, prof)
        train_s = fixed_s + steps_s / ranks
        assert p["cells"] == 8 and p["eval_jobs"] == 9 and p["steps"] == 8 * t.steps
        assert p["train_h"] == pytest.approx(train_s / 3600) and p["eval_h"] == pytest.approx(eval_s / 3600)
        assert p["gpu_hours"] == pytest.approx((2 * train_s + eval_s + 24) / 3600)  # evaluate/diagnose: 1 GPU
        # every job the study runs, scheduled on the profile's 4 job slots (tests/pipeline/test_doctor_jobs.py: the schedule)
        assert p["jobs"] == {"base_model": 1, "train": 8, "evaluate": 9, "diagnose": 8, "aggregate": 1}
        assert p["serial_h"] == pytest.approx((train_s + eval_s + 24) / 3600)  # base and aggregate: not measured
        assert p["serial_h"] / 4 < p["wall_h"] < p["serial_h"] and p["concurrent_jobs"] == 4
        assert "base jobs: not measured" in " ".join(p["assumptions"])


@pytest.mark.parametrize("argv,msg", [(["--cell", "nope"], "no cell 'nope'"), (["--steps", "0"], "--steps"),
                                      (["--profile", "nowhere"], "no such profile"),
                                      (["--config", "partition=gpu"], "KEY one of launcher, slurm, tracking"),
                                      (["--config", "launcher=pbs"], "allowed: debug, local, slurm"),
                                      (["--config", "slurm=[1]"], "--config slurm: must be a mapping"),
                                      (["--config", "pack={max_cells: 4, places: 2}"], "needs pack.resident: true"),
                                      (["--config", "tracking=mongo://x"], "tracking: 'mongo://x' is not allowed")])
def test_bad_input_exits_2_before_writing(tmp_path, capsys, argv, msg):
    assert main(["doctor", DEMO, "--results", str(tmp_path), *argv]) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_failed_check_stops_before_training(results, tmp_path, capsys):
    study = tiny_study("gpuonly", task=None, adapter=None, eval=None, model=str(results / "models" / "tiny-arith"),
                       train={"steps": 5, "max_completion_length": 8}, rollout={"engine": "vllm"}, axes=None)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "config.yaml").write_text("config: {launcher: debug}\ncores: 1\n")
    rc = main(["doctor", str(tmp_path / "s.yaml"), "--results", str(tmp_path / "res"), "--profile", str(prof)])
    assert rc == 1
    rep = json.loads((tmp_path / "res" / "gpuonly" / "doctor" / "doctor.json").read_text())
    checks = {c["check"]: c for c in rep["measured"]["checks"]}
    assert not checks["rollout engine"]["ok"] and "needs a CUDA GPU" in checks["rollout engine"]["detail"]
    assert checks["model and tokenizer load"]["ok"] and "smoke training" not in checks
    mem = checks["evaluation memory"]  # every evaluation job's KV cache, planned; on a CPU reported, not failed
    assert mem["ok"] and mem["detail"].startswith("CPU (host memory, not checked): cell: hf 64 x 80 tokens (synthetic)"), mem
    assert "projection" not in rep and "**NO**" in capsys.readouterr().out
    assert not list((tmp_path / "res").rglob("metrics.csv"))


@pytest.mark.slow
def test_doctor_demo_end_to_end_on_the_cpu(results, capsys):
    rc = main(["doctor", DEMO, "--steps", "2", "--results", str(results), "--eval-limit", "4", "--cell", "r8-kl0.05-s1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    ddir = results / "demo" / "doctor"
    rep = json.loads((ddir / "doctor.json").read_text())
    md = (ddir / "doctor.md").read_text()
    assert md in out and "Projection of the whole study" in md and "GPU-hours" in md
    m = rep["measured"]
    assert rep["ok"] and m["device"]["kind"] == "cpu" and m["dtype"] == "float32" and m["peak_memory_gb"] > 0
    assert m["precision"] == "fp32" and list(m["trainable_dtypes"]) == ["float32"]  # from the smoke's summary
    assert "| dtype used | fp32: weights loaded in float32, trainable tensors float32 x" in md
    assert m["memory_plan"]["peak_gb"] > 0 and "`lorarl memory` projects" in md  # the plan beside the measure
    assert f"measured/projected {m['peak_memory_gb'] / m['memory_plan']['peak_gb']:.2f}" in md
    names = [c["check"] for c in m["checks"]]
    for want in ("MLflow store", "training prompt lengths", "rollout engine", "model and tokenizer load", "tokenizer", "reward regime (teacher/PRM checks)",
                 "training data loads", "evaluation data: synthetic", "smoke training", "rollout freshness gate",
                 "evaluation: synthetic", "weight diagnostics", "memory headroom", "completions cut at the cap",
                 "evaluation memory"):
        assert want in names
    assert 0 <= m["truncation"]["share"] <= 1 and m["truncation"]["steps"] == 2  # the smoke's own rollouts
    assert f"| completions cut at the cap | yes | {m['truncation']['detail']} |" in md
    sp = m["split"]
    parts = sp["rollout_generation_s"] + sp["reward_s"] + sp["old_policy_forward_and_advantages_s"] + \
        sp["reference_forward_s"] + sp["policy_forward_backward_s"]
    assert sp["step_s"] > 0 and parts == pytest.approx(sp["step_s"], rel=0.05)
    assert sp["reference_forward_s"] > 0  # beta 0.05: a reference forward every step
    assert sp["rollout_tokens_per_s"] > 0 and m["evaluation"]["synthetic"]["problems"] == 4
    p = rep["projection"]
    assert p["cells"] == 8 and p["steps"] == 640 and p["eval_jobs"] == 9 and p["gpu_hours"] == 0
    # every job of the study (the base model is built), each with the start-up measured here, and Snakemake's start;
    # the job list is Snakemake's own (its dry run: a check)
    assert p["jobs"] == {"train": 8, "evaluate": 9, "diagnose": 8, "aggregate": 1}
    st = p["startup"]
    assert p["serial_h"] * 3600 == pytest.approx(3600 * (p["train_h"] + p["eval_h"] + p["diagnostics_h"] + p[
        "aggregate_h"]) + st["Snakemake's start (once)"], abs=0.01)
    assert 0 < st["per launched job"] < st["per model job (+ imports, store, first load)"] and p["aggregate_h"] > 0
    assert p["wall_idle_h"] <= p["wall_h"] <= p["serial_h"] and "Start-up of every job" in md
    assert {"aggregation", "job list (Snakemake's dry run)", "evaluation of the base model (1 problem): synthetic"} \
        <= set(names)
    assert p["problem_counts"] == {"synthetic": 200} and p["assumptions"]
    # prompt tokens of every cell (one tokenizer, one prompt: all equal) and the measured degenerate-group rate
    assert sorted(m["prompt_tokens"]) == sorted(c.id for c in study_cells(load_study(DEMO)))
    assert len(set(m["prompt_tokens"].values())) == 1 and list(m["prompt_tokens"].values())[0] > 3
    assert 0 <= sp["degenerate_rate"] <= 1 and p["degenerate_rate"] == sp["degenerate_rate"]
    assert [r["rounds_per_rollout"] for r in p["per_cell"]] == [1.0] * 8  # the demo has no DAPO cell
    assert not (results / "demo" / "r8-kl0.05-s1").exists()  # the real study's cells are untouched


def test_profiles_give_the_launcher_and_resources_the_study_runs_with():
    from lorarl.pipeline.doctor.report import parse_overrides
    from lorarl.language.profiles import read_profile

    local = read_profile(None)
    assert local["launcher"] == "local" and local["jobs"] == 2
    slurm = read_profile("slurm")
    want = yaml.safe_load((ROOT / "profiles" / "slurm" / "cluster.yaml").read_text())
    assert slurm["launcher"] == "slurm" and slurm["slurm"]["train"] == want["slurm"]["train"] and slurm["jobs"] == 32
    assert slurm["tracking"] == want["tracking"] and want["tracking"].startswith("http")
    # `--config KEY=VALUE` (YAML values) overrides the profile as `snakemake --config` does: a mapping merges key by key
    over = read_profile("slurm", parse_overrides(["tracking=sqlite", 'slurm={"train": {"partition": "a100"}}']))
    assert over["tracking"] == "sqlite" and over["slurm"]["train"] == {**want["slurm"]["train"], "partition": "a100"}
    assert {k: v for k, v in over["slurm"].items() if k != "train"} == {k: v for k, v in want["slurm"].items()
                                                                        if k != "train"}
    assert over["launcher"] == "slurm" and local["tracking"] == "sqlite"


@pytest.mark.parametrize("config, over", [
    ({"pack": 1}, {"pack": {"resident": True, "places": 2}}),
    ({"pack": {"max_cells": 1}}, {"pack": {"resident": True, "places": 2}}),
    ({"slurm": {"train": {"partition": "a", "gpus": 1}, "evaluate": {"gpus": 1}}}, {"slurm": {"train": {"gpus": 2}}}),
    ({"a": {"b": 1}}, {"a": 3}),
    ({"a": 3}, {"a": {"b": 1}}),
    ({}, {"x": [1, 2], "y": None}),
])
def test_profile_layers_merge_as_snakemake_merges_them(config, over):
    import copy

    from snakemake.utils import update_config

    from lorarl.language.profiles import merge

    want = copy.deepcopy(config)
    update_config(want, copy.deepcopy(over))
    assert merge(config, over) == want


def test_tracking_check_reaches_the_store_or_fails_fast(tmp_path, monkeypatch):
    """The job's first check: the profile's MLflow store answers from the node (sqlite: created here)."""
    import socket

    from lorarl.pipeline.doctor.job import tracking_check

    monkeypatch.setenv("LORARL_TRACKING", "sqlite")
    assert tracking_check(str(tmp_path)).endswith(f"{tmp_path}/mlflow.db") and (tmp_path / "mlflow.db").exists()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: a tracking server that is down
    monkeypatch.setenv("LORARL_TRACKING", f"http://127.0.0.1:{port}")
    with pytest.raises(Exception, match=f"127.0.0.1:{port}"):
        tracking_check(str(tmp_path))
