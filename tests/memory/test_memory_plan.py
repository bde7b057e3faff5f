"""`lorarl memory`: every published study fits one 80 GB GPU with its settings, names the knob at 8 GB,
and refuses bad input with exit 2; the plan's arithmetic on known shapes."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from lorarl.cli import main
from lorarl.memory import plan_cell, plan_study
from lorarl.memory.arch import PUBLISHED, arch_for
from lorarl.language.study import load_study, study_cells

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
PUBLISHED_STUDIES = sorted(p for p in EXPERIMENTS.glob("*.yaml") if not p.stem.endswith("_cpu") and p.stem not in ("demo", "demo_adaptive"))
KNOBS = ("train.micro_batch_size", "train.gradient_checkpointing", "rollout.generation_batch_size",
         "slurm.train.gpus_per_node", "a GPU with more memory", "eval.batch_size")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["memory", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("path", PUBLISHED_STUDIES, ids=lambda p: p.stem)
def test_published_study_fits_80gb_and_names_the_knob_at_8gb(path):
    rc, out, _ = run_cli(str(path), "--gpu-memory-gb", "80")
    assert rc == 0, out
    assert "NO" not in out.split("\n\n")[0]
    if load_study(path).kind != "grpo":  # the toy KL-bound study: no model on a GPU
        assert "nothing to plan" in out
        return
    rc, out, _ = run_cli(str(path), "--gpu-memory-gb", "8")
    assert rc == 1
    fixes = [line for line in out.splitlines() if "does not fit; fix:" in line]
    assert fixes and all(any(k in line for k in KNOBS) for line in fixes)


def test_bad_input_exits_2(tmp_path):
    demo = str(EXPERIMENTS / "demo.yaml")
    assert run_cli(str(tmp_path / "missing.yaml"))[0] == 2
    rc, _, err = run_cli(demo, "--cell", "no-such-cell")
    assert rc == 2 and "no-such-cell" in err
    rc, _, err = run_cli(demo, "--cell", "base")
    assert rc == 2 and "base pseudo-cell" in err
    rc, _, err = run_cli(demo, "--gpu-memory-gb", "0")
    assert rc == 2 and "--gpu-memory-gb" in err
    for flag in ("--gpus", "--nodes"):
        rc, _, err = run_cli(demo, flag, "0")
        assert rc == 2 and f"{flag} must be a whole number >= 1" in err and "slurm.train." in err
    rc, _, err = run_cli(demo, "--gpus", "8", "--nodes", "8")  # 64 ranks, the demo's update has 32 rows
    assert rc == 2 and "64 training ranks" in err and "--gpus x --nodes" in err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: unknown\ndefaults:\n  model: nobody/no-such-model-anywhere\n")
    rc, _, err = run_cli(str(unknown))
    assert rc == 2 and "no-such-model-anywhere" in err and "allowed" in err


def test_published_table_counts_match_the_model_cards():
    # DeepSeek-R1-Distill-Qwen-1.5B: 1.78B parameters (untied 151,936 x 1,536 lm_head); Qwen3-8B: 8.19B
    assert arch_for("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B").params() == pytest.approx(1.777e9, rel=0.01)
    assert PUBLISHED["Qwen/Qwen3-8B"].params() == pytest.approx(8.19e9, rel=0.01)
    assert PUBLISHED["Qwen/Qwen3-1.7B-Base"].params() == pytest.approx(1.72e9, rel=0.01)


def test_the_knob_is_the_one_that_fixes_it():
    study = load_study(EXPERIMENTS / "peft_zoo.yaml")
    cfg = next(c.config for c in study_cells(study) if c.config.adapter.method == "lora")
    whole = cfg.model_copy(update={"train": cfg.train.model_copy(update={"micro_batch_size": None}),
                                   "rollout": cfg.rollout.model_copy(update={"generation_batch_size": None})})
    p = plan_cell(whole, 80)
    assert not p.fits and p.max_micro_batch >= 1
    assert any(k.startswith(f"train.micro_batch_size: {p.max_micro_batch}") for k in p.knobs)
    fixed = whole.model_copy(update={"train": whole.train.model_copy(update={"micro_batch_size": p.max_micro_batch}),
                                     "rollout": whole.rollout.model_copy(
                                         update={"generation_batch_size": p.max_generation_batch})})
    assert plan_cell(fixed, 80).fits  # the named values do fit
    off = fixed.model_copy(update={"train": fixed.train.model_copy(update={"gradient_checkpointing": "off"})})
    p_off = plan_cell(off, 80)
    assert not p_off.fits and any(k.startswith("train.gradient_checkpointing: on") for k in p_off.knobs)


def test_teacher_on_the_second_gpu_when_one_gpu_cannot_hold_it():
    plans = {p.cell: p for p in plan_study(str(EXPERIMENTS / "reward_density.yaml"), 24, gpus=1)}
    two = {p.cell: p for p in plan_study(str(EXPERIMENTS / "reward_density.yaml"), 24, gpus=2)}
    distil = plans["distillation-r1-s0"]
    assert not distil.fits and distil.knobs == [
        "slurm.train.gpus_per_node: 2 (the profile's train resources; teacher/PRM on the second GPU)"]
    assert two["distillation-r1-s0"].fits and two["distillation-r1-s0"].aux_gpu_gb > 15  # Qwen3-8B bf16
    # no aux model: 2 GPUs are 2 DDP ranks, each a replica updating on half the rows
    assert (two["outcome-r1-s0"].ranks, two["outcome-r1-s0"].strategy, two["distillation-r1-s0"].ranks) == (2, "ddp", 1)
    assert two["outcome-r1-s0"].rank_rows * 2 == plans["outcome-r1-s0"].rank_rows == plans["outcome-r1-s0"].rows


def test_the_profile_gives_the_gpus_per_job(tmp_path):
    study = str(EXPERIMENTS / "reward_density.yaml")
    prof = tmp_path / "twogpus"
    prof.mkdir()
    (prof / "config.yaml").write_text("config:\n  launcher: slurm\n  slurm: {train: {gpus_per_node: 2}}\n")
    rc, out, _ = run_cli(study, "--gpu-memory-gb", "24", "--profile", "slurm")  # the shipped profile: 1 GPU
    assert rc == 1 and "slurm.train.gpus_per_node: 2" in out
    rc, out, _ = run_cli(study, "--gpu-memory-gb", "24", "--profile", str(prof), "--cell", "distillation-r1-s0")
    assert "2 GPU(s)" in out and "NO" not in out.split("evaluation jobs")[0]  # training fits (its 64-sequence
    assert rc == 1 and "eval.batch_size: 34" in out  # evaluation batch of 4,608-token sequences does not, on 24 GiB)
    assert run_cli(study, "--profile", str(tmp_path / "nope"))[0] == 2
