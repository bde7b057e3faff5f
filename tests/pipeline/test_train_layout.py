"""A cell's training layout is runtime (lorarl.pipeline.jobs.train_layout): the profile's slurm.train with
per-model / per-study overrides, one rank per GPU, and never part of the cell's training signature."""

from __future__ import annotations

import pytest

from lorarl.pipeline.jobs import train_layout as tl
from lorarl.language.study import parse_study, study_cells

TRAIN = {"partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 8,
         "layouts": {"by_model": {"big/model": {"gpus_per_node": 8}},
                     "by_study": {"huge": {"nodes": 4, "gpus_per_node": 8}, "cpu2": {"tasks_per_node": 2}}}}


def cell(study: str = "s", model: str = "local:tiny-test", **reward):
    defaults = {"model": model, **({"reward": reward} if reward else {})}
    return study_cells(parse_study({"name": study, "defaults": defaults}))[0]


def test_overrides_by_model_then_by_study():
    assert tl.train_resources(TRAIN, "s", "small/model") == {"partition": "gpu", "gpus_per_node": 1,
                                                             "cpus_per_task": 8}
    assert tl.ranks(tl.train_resources(TRAIN, "s", "big/model")) == 8  # one rank per GPU
    huge = tl.train_resources(TRAIN, "huge", "big/model")  # the study's wins over the model's
    assert huge["nodes"] == 4 and tl.ranks(huge) == 32 and huge["partition"] == "gpu"
    cpu = tl.job_resources(tl.train_resources(TRAIN, "cpu2", "x"), None, "local")
    assert cpu["tasks_per_node"] == 2  # CPU ranks: tasks_per_node set explicitly
    assert "layouts" not in TRAIN["layouts"] and "layouts" in TRAIN  # the profile's mapping is left as it was


def test_bad_layouts_name_the_field():
    with pytest.raises(ValueError, match=r"slurm.train.layouts: unknown keys \['by_node'\]; allowed: by_model"):
        tl.train_resources({"layouts": {"by_node": {}}}, "s", "m")
    with pytest.raises(ValueError, match=r"slurm.train.gpus_per_node: a positive number"):
        tl.ranks({"gpus_per_node": 0})
    with pytest.raises(ValueError, match="runs one node"):
        tl.job_resources({"nodes": 2, "gpus_per_node": 2}, None, "local")


def test_the_larger_layout_of_the_last_out_of_memory_retry():
    """layouts.on_oom: applied over the cell's own layout; None when absent or not more ranks than the cell's."""
    prof = {**TRAIN, "layouts": {**TRAIN["layouts"], "on_oom": {"gpus_per_node": 8}}}
    assert tl.oom_resources(TRAIN, "s", "small/model") is None  # the profile allows none
    big = tl.oom_resources(prof, "s", "small/model")
    assert tl.ranks(big) == 8 and big["partition"] == "gpu" and "layouts" not in big
    assert tl.oom_resources(prof, "s", "big/model") is None  # 8 GPUs already: not larger
    assert tl.oom_resources(prof, "huge", "big/model") is None  # 4 nodes x 8 GPUs already: on_oom adds none
    assert tl.train_resources(prof, "s", "small/model") == tl.train_resources(TRAIN, "s", "small/model")
    with pytest.raises(ValueError, match="slurm.train.layouts.on_oom: a mapping"):
        tl.oom_resources({"layouts": {"on_oom": 2}}, "s", "m")


def test_teacher_on_the_second_gpu_of_two_keeps_one_rank():
    teacher = cell(regime="distillation", teacher="local:tiny-test").config
    assert tl.tasks_per_node({"gpus_per_node": 2}, teacher) == 1
    assert tl.tasks_per_node({"gpus_per_node": 2}, cell().config) == 2
    assert tl.tasks_per_node({"gpus_per_node": 4}, teacher) == 4


def test_the_layout_is_not_in_the_training_signature():
    one, big = cell("huge"), cell("huge")
    assert tl.ranks(tl.train_resources(TRAIN, "huge", one.config.model)) == 32
    assert tl.ranks(tl.train_resources({"gpus_per_node": 1}, "huge", one.config.model)) == 1
    assert one.hash == big.hash  # same study, any layout: the same cell
    assert not {"nodes", "tasks_per_node", "gpus_per_node", "layouts"} & set(one.flat_config())


def test_local_executor_starts_one_process_per_rank(tmp_path):
    from lorarl.pipeline.jobs.launch import make_executor

    ex = make_executor("local", tmp_path, 1, {"tasks_per_node": 2, "partition": "gpu"})
    assert ex._executor.parameters["tasks_per_node"] == 2
    assert make_executor("local", tmp_path, 1, {})._executor.parameters.get("tasks_per_node", 1) == 1


def test_export_ranks_outside_a_submitit_job_changes_nothing(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert tl.export_ranks() == 1


def test_a_job_of_several_ranks_meets_on_a_port_below_the_ephemeral_range(monkeypatch):
    """Rank 1 of a 2-task Slurm job (as submitit's job environment reads it): the rendezvous on the first node, at a
    port from the job id below the kernel's ephemeral ports, the inherited MASTER_PORT replaced."""
    import os

    for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):  # restored after the test
        monkeypatch.setenv(k, "unset")
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_NNODES": "2",
           "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[1-2]",
           "MASTER_PORT": "29500"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert tl.export_ranks() == 2
    assert os.environ["MASTER_ADDR"] == "node1" and os.environ["RANK"] == "1" and os.environ["WORLD_SIZE"] == "2"
    assert os.environ["MASTER_PORT"] == str(tl.rendezvous_port("4242")) == "24242"
    ports = {tl.rendezvous_port(str(j)) for j in range(1, 40000, 7)} | {tl.rendezvous_port("123_4")}
    assert min(ports) >= 20000 and max(ports) <= 32767 and len(ports) > 1000
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert max(ports) < int(f.read().split()[0])  # this machine's ephemeral ports start above all of them


def test_a_slurm_job_of_several_ranks_ends_every_task_when_one_dies():
    """srun's --kill-on-bad-exit on a job of several ranks (a rank dead before the collective timeout applies must
    not leave the others holding their nodes); the profile's srun_args are kept, its own -K setting wins."""
    two = tl.job_resources({"nodes": 2, "tasks_per_node": 1}, None, "slurm")
    assert two["srun_args"] == [tl.KILL_ON_BAD_EXIT]
    assert "srun_args" not in tl.job_resources({"gpus_per_node": 1}, None, "slurm")  # one rank: nothing to end
    assert "srun_args" not in tl.job_resources({"tasks_per_node": 2}, None, "local")  # no srun
    kept = tl.job_resources({"gpus_per_node": 2, "srun_args": ["--cpu-bind=none"]}, None, "slurm")
    assert kept["srun_args"] == ["--cpu-bind=none", tl.KILL_ON_BAD_EXIT]
    prefixed = tl.job_resources({"gpus_per_node": 2, "slurm_srun_args": ["-v"]}, None, "slurm")
    assert prefixed["slurm_srun_args"] == ["-v", tl.KILL_ON_BAD_EXIT] and "srun_args" not in prefixed
    assert tl.job_resources({"gpus_per_node": 2, "srun_args": ["--kill-on-bad-exit=0"]}, None,
                            "slurm")["srun_args"] == ["--kill-on-bad-exit=0"]  # the profile's choice
    from lorarl.pipeline.jobs.slurm import slurm_parameters
    assert slurm_parameters(two)[1]["slurm_srun_args"] == [tl.KILL_ON_BAD_EXIT]  # what submitit receives
    # a pack job's ranks each train their own members: a failed rank leaves the others to finish and stage theirs
    pack = tl.pack_resources({"gpus_per_node": 2}, "s", [cell().config, cell().config], "slurm")
    assert tl.ranks(pack) == 2 and "srun_args" not in pack
