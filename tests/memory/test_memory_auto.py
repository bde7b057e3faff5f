"""Job start: `auto` memory knobs take the plan's values on the job's GPU (the whole batch on a CPU), and
the teacher / PRM go where the job's GPUs are (1 GPU: beside the policy; 2: the second)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lorarl.memory import plan_cell
from lorarl.memory.auto import job_cell, place_aux, resolve_job
from lorarl.memory.plan import GIB
from lorarl.language.study import load_study, study_cells

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def cell(study: str, cell_id: str):
    return next(c for c in study_cells(load_study(EXPERIMENTS / study)) if c.id == cell_id)


@pytest.mark.parametrize("setting,gpus,want", [
    ("cuda:1", 1, "cuda:0"), (None, 1, None), ("cuda", 1, "cuda:0"), ("cpu", 1, "cpu"),
    ("cuda:1", 2, "cuda:1"), (None, 2, "cuda:1"), ("cuda:3", 2, "cuda:1"), ("cuda:0", 2, "cuda:0"),
    ("cuda:1", 0, None), (None, 0, None), ("cpu", 0, "cpu")])
def test_aux_placement(setting, gpus, want):
    assert place_aux(setting, gpus) == want


@pytest.mark.parametrize("gpus,want", [(1, "cuda:0"), (2, "cuda:1")])
def test_reward_density_teacher_and_prm_follow_the_device_count(monkeypatch, gpus, want):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * GIB, 80 * GIB))
    for cid, field in (("distillation-r1-s0", "teacher_device"), ("process-r1-s0", "prm_device")):
        c = cell("reward_density.yaml", cid)
        assert getattr(c.config.reward, field) == "cuda:1"  # what the study names
        lines: list[str] = []
        cfg = resolve_job(c.config, log=lines.append)
        assert getattr(cfg.reward, field) == want
        assert any(field in line for line in lines) == (want != "cuda:1")


def test_auto_takes_the_plans_values_on_a_gpu_and_the_whole_batch_on_a_cpu():
    c = cell("peft_zoo.yaml", "lora")  # its vLLM engine made HF generate here: the generation chunk is the plan's
    c = replace(c, config=c.config.model_copy(update={"rollout": c.config.rollout.model_copy(update={"engine": "hf"})}))
    assert c.config.train.micro_batch_size == "auto" and c.config.rollout.generation_batch_size == "auto"
    lines: list[str] = []
    gpu = resolve_job(c.config, gpus=1, free_bytes=int(79.2 * GIB), log=lines.append)
    want = plan_cell(c.config, 79.2)
    assert gpu.train.micro_batch_size == want.max_micro_batch >= 1
    assert gpu.rollout.generation_batch_size == want.max_generation_batch >= 1
    assert lines and "79.2 GiB free" in lines[-1]
    small = resolve_job(c.config, gpus=1, free_bytes=40 * GIB, log=lines.append)
    assert small.rollout.generation_batch_size < gpu.rollout.generation_batch_size  # less memory, smaller chunk
    cpu = resolve_job(c.config, gpus=0, log=lines.append)
    assert cpu.train.micro_batch_size is None and cpu.rollout.generation_batch_size is None
    resolved = job_cell(c, gpus=1, free_bytes=80 * GIB, log=lines.append)
    assert resolved.hash == c.hash and resolved.id == c.id  # runtime settings: the signature is unchanged


def test_settings_that_are_not_auto_are_kept():
    c = cell("demo.yaml", "r1-kl0-s0")
    cfg = resolve_job(c.config, gpus=1, free_bytes=80 * GIB, log=lambda s: None)
    assert cfg.train.micro_batch_size is None and cfg.rollout.generation_batch_size is None
    assert cfg.model_dump() == c.config.model_dump()


def test_auto_on_a_model_the_plan_does_not_know_is_a_clear_error():
    from lorarl.language.config import CellConfig

    cfg = CellConfig.model_validate({"model": "nobody/unknown-model", "train": {"micro_batch_size": "auto"}})
    with pytest.raises(ValueError, match="micro_batch_size / rollout.generation_batch_size auto need the memory plan"):
        resolve_job(cfg, gpus=1, free_bytes=80 * GIB, log=lambda s: None)
    assert resolve_job(cfg, gpus=0, log=lambda s: None).train.micro_batch_size is None  # CPU: the whole batch


def test_the_trainer_takes_a_resolved_config_and_refuses_auto():
    """Resources are resolved where the job starts (lorarl.pipeline.jobs.stages); the trainer resolves nothing
    and refuses a config with an `auto` knob left, naming it."""
    from lorarl.train.main import job_config

    c = study_cells(load_study(EXPERIMENTS / "init_geometry.yaml"))[0]
    assert c.config.train.micro_batch_size == "auto"
    with pytest.raises(ValueError, match=r"train.micro_batch_size, rollout.generation_batch_size still auto"):
        job_config(c, None)
    resolved = resolve_job(c.config, gpus=0, log=lambda s: None)
    assert job_config(c, resolved) is resolved and resolved.train.micro_batch_size is None
