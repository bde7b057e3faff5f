"""Local jobs see the launcher's GPUs. submitit's local executor exports CUDA_VISIBLE_DEVICES for the GPUs a job
asks for, none by default, so every local job (a study under plain `snakemake all`, `lorarl doctor`'s smoke job) on
a GPU machine trained on the CPU: the first GPU acceptance run found it (docs/gpus.md)."""

from __future__ import annotations

import os

import pytest

from lorarl.pipeline.jobs.executor import local_gpus, make_executor


@pytest.mark.parametrize("env, driver, asked, want", [
    ({}, 2, None, (0, 1)),                              # every GPU the driver lists
    ({}, 2, 1, (0,)),                                   # the profile's gpus_per_node caps it
    ({}, 0, None, ()),                                  # a CPU machine: none
    ({"CUDA_VISIBLE_DEVICES": "3,5"}, 8, None, (3, 5)),  # the launcher's own share, by index
    ({"CUDA_VISIBLE_DEVICES": "3,5"}, 8, 1, (3,)),
    ({"CUDA_VISIBLE_DEVICES": ""}, 8, None, ()),         # hidden from the launcher: hidden from its jobs
])
def test_local_gpus(tmp_path, env, driver, asked, want):
    d = tmp_path / "gpus"
    d.mkdir()
    for i in range(driver):
        (d / f"0000:0{i}:00.0").mkdir()
    assert local_gpus(asked, env, d) == want


@pytest.mark.parametrize("resources, want", [(None, "3,5"), ({"gpus_per_node": 1}, "3")])
def test_a_local_job_sees_the_launchers_gpus(tmp_path, monkeypatch, resources, want):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    ex = make_executor("local", tmp_path / resources.__class__.__name__, 1, resources)
    assert ex.submit(os.getenv, "CUDA_VISIBLE_DEVICES").result() == want  # read in the job's own process
