"""The doctor's projection for a multi-GPU layout: a training job of the profile's slurm.train nodes x
gpus_per_node GPUs trains on that many ranks, its steps scaled from the smoke's ranks (ideal data-parallel
scaling, said so), and GPU-hours = job seconds x the job's GPUs (lorarl.pipeline.doctor.projection)."""

from __future__ import annotations

import pytest
import yaml

from lorarl.memory.layout import Layout
from lorarl.pipeline.doctor.projection import project, stage_layouts, step_seconds
from lorarl.language.study import load_study, study_cells
from tests.support.study import tiny_study

SPLIT = {"rollout_generation_s": 1.0, "reward_s": 0.1, "old_policy_forward_and_advantages_s": 0.1,
         "scoring_s": 1.2, "reference_forward_s": 0.3, "policy_forward_backward_s": 0.5, "step_s": 2.0,
         "generation_rounds_per_step": 1.0, "kl_monitor_per_run_s": 0.0}


def _study(tmp_path, axes):
    spec = tiny_study("lay", adapter=None, eval=None, task={"name": "synthetic", "n_train": 64},
                      train={"steps": 10, "prompts_per_step": 4, "generations": 2,
                             "max_completion_length": 20, "beta": 0.05},
                      axes=axes)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_study(tmp_path / "s.yaml")


def _profile(**train):
    return {"name": "slurm", "launcher": "slurm", "jobs": 1,
            "slurm": {"train": train, "evaluate": {"gpus_per_node": 1}, "diagnose": {}}}


def test_projection_scales_steps_and_gpu_hours_for_the_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    axes = {"v": {"values": [{"label": "outcome", "set": {"seed": 0}},
                             {"label": "distil", "set": {"reward.regime": "distillation",
                                                         "reward.teacher": "local:tiny-test"}}]}}
    study = _study(tmp_path, axes)
    cells = study_cells(study)
    by = {c.id: c.config for c in cells}
    m = {"split": SPLIT, "model_load_s": 3.0, "diagnose_s": 0.0, "device": {"kind": "cuda"}, "evaluation": {},
         "prompt_tokens": {"outcome": 10.0, "distil": 10.0}}
    step = {cid: step_seconds(cfg, SPLIT, by["outcome"], 10.0, 10.0, None)[0] for cid, cfg in by.items()}
    # (train resources, smoke ranks): ranks per cell (outcome, distil), GPUs per training job
    for train, smoke_ranks, ranks, gpus in [
        ({"gpus_per_node": 1}, 1, (1, 1), 1),
        ({"gpus_per_node": 4, "nodes": 2}, 1, (8, 8), 8),
        ({"gpus_per_node": 4, "nodes": 2}, 2, (8, 8), 8),  # a smoke on 2 ranks: steps x 2/8
        ({"gpus_per_node": 2}, 1, (2, 1), 2),  # the teacher cell: one rank, the teacher on the second GPU
    ]:
        p = project(study, cells[0], {**m, "train_ranks": smoke_ranks}, _profile(**train))
        rows = {r["cell"]: r for r in p["per_cell"]}
        assert (rows["outcome"]["ranks"], rows["distil"]["ranks"]) == ranks
        want = {cid: 3.0 + 10 * step[cid] * smoke_ranks / rows[cid]["ranks"] for cid in by}
        assert p["train_h"] == pytest.approx(sum(want.values()) / 3600)
        assert p["gpu_hours"] == pytest.approx(sum(want.values()) * gpus / 3600)  # no evaluation measured
        assert p["gpus_per_job"]["train"] == gpus and p["smoke_ranks"] == smoke_ranks
        text = "\n".join(p["assumptions"])
        assert "ideal data-parallel scaling" in text and "do not scale" in text and f"x {smoke_ranks}/W" in text


def test_stage_layouts_read_the_profile():
    lay = stage_layouts(_profile(gpus_per_node="8", nodes="4"), "cuda")  # Snakemake hands strings over
    assert lay["train"] == Layout(8, 4) and lay["evaluate"] == Layout(1, 1) and lay["diagnose"] == Layout(1, 1)
    assert stage_layouts(_profile(), "cpu")["train"] is None  # a CPU smoke asks no GPU
