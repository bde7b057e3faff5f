"""One cell on several ranks (lorarl.train.ranks): the ranks train exactly what one process trains.

Fast: the layout checks and per-rank batch of grpo_args. Slow (`slow`): the cell trained by
`torchrun --nproc_per_node 2` (gloo, CPU) equals the same cell trained by one process, step by step
(loss, grad norm, KL, rewards, lorarl's metrics) and in its final weights, for a LoRA cell with two PPO
mini-batches per rollout (the gathered one-process mini-batches) and DAPO refills, and for full fine-tuning (FSDP2, killed mid-run and resumed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lorarl.train import ranks
from tests.support.resume import build_models
from tests.support.distributed import STEPS, assert_same_cell, weights
from tests.support.study import TRAIN, seeds, tiny_study, write_study

# compared step by step: TRL's loss/grad norm/rewards and lorarl's own (reduced over the ranks) metrics


# ---- fast ----------------------------------------------------------------------------------------

def test_layout_keeps_prompt_groups_whole_and_names_the_field():
    ranks.check_layout(4, 8, 32, 4)  # 4 prompts, 4 ranks: one group each
    with pytest.raises(ValueError, match=r"train.prompts_per_step \(2\).*3 ranks"):
        ranks.check_layout(2, 4, 8, 3)
    with pytest.raises(ValueError, match=r"one update's 2 sequences.*4 ranks"):
        ranks.check_layout(4, 2, 2, 4)  # mini-batches of one prompt cannot split over 4 ranks
    with pytest.raises(ValueError, match="must be >= 1"):
        ranks.check_layout(4, 2, 8, 0)


def test_grpo_args_split_each_update_over_the_ranks(tmp_path):
    from lorarl.language.study import parse_study, study_cells
    from lorarl.train.trl_args import grpo_args

    cell = study_cells(parse_study(tiny_study("r", task=None, adapter=None, eval=None,
                                              train={"prompts_per_step": 4, "generations": 2, "mini_batch_prompts": 2},
                                              axes=None)))[0]
    one, two = grpo_args(cell.config, tmp_path, True, ranks=1), grpo_args(cell.config, tmp_path, True, ranks=2)
    assert one.per_device_train_batch_size == 4 and two.per_device_train_batch_size == 2  # 2 prompts x 2 per update
    assert one.steps_per_generation == two.steps_per_generation == 2
    assert two.ddp_timeout == ranks.collective_timeout_s()
    with pytest.raises(ValueError, match="prompts_per_step"):
        grpo_args(cell.config, tmp_path, True, ranks=3)


def test_full_fine_tuning_on_several_ranks_asks_the_trainer_for_fsdp2(tmp_path):
    """train.sharding auto on 2 ranks: FSDP2 for full fine-tuning, DDP for adapters; as set otherwise."""
    import torch

    from lorarl.language.study import parse_study, study_cells
    from lorarl.train.sharding import shard_sizes
    from lorarl.train.trl_args import grpo_args

    def args(method: str, n: int, sharding: str = "auto"):
        cell = study_cells(parse_study(tiny_study("r", task=None, eval=None,
                                                  adapter={"method": method},
                                                  train={"prompts_per_step": 4, "generations": 2, "sharding": sharding},
                                                  axes=None)))[0]
        return grpo_args(cell.config, tmp_path, True, ranks=n)

    full = args("full", 2)
    assert full.fsdp_plugin_args["fsdp_version"] == 2 and full.fsdp_plugin_args["reshard_after_forward"]
    assert full.fsdp_plugin_args["state_dict_type"] == "FULL_STATE_DICT"
    assert all(a.fsdp_plugin_args is None for a in (args("full", 1), args("lora", 2), args("full", 2, "ddp")))
    assert args("lora", 2, "fsdp2").fsdp_plugin_args["fsdp_version"] == 2  # an adapter cell on a sharded base
    assert shard_sizes(torch.nn.Linear(3, 2)) == (8, 8)  # an unsharded module holds all of itself


def test_ranks_default_to_the_job_environment(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert ranks.world_size() == 1 and ranks.is_main()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert ranks.world_size() == 4 and ranks.rank() == 3 and not ranks.is_main()
    assert ranks.broadcast({"x": 1}) == {"x": 1}  # no process group: the value itself


# ---- slow: one process vs two ranks ----------------------------------------------------------------

def study(root: Path, teacher: Path, base: Path, adapter: dict, evaluate: dict | None = None, **train) -> Path:
    (root / "models").mkdir(parents=True, exist_ok=True)
    if not (root / "models" / "tiny-test").exists():
        os.symlink(base, root / "models" / "tiny-test")
    d = tiny_study("dist", adapter=adapter, eval=evaluate or None,
                   train={**TRAIN, "steps": STEPS, "max_completion_length": 10, "beta": 0.05, "kl_monitor_every": 1,
                          **train},
                   reward={"regime": "distillation", "teacher": str(teacher)},  # dense, varied rewards: it really learns
                   axes=seeds(3))
    return write_study(root / "study.yaml", d)


def train(study_file: Path, nproc: int, expect_ok: bool = True, **env_vars: str) -> Path:
    """Train the cell (``torchrun`` for ``nproc`` > 1); its output is kept in ``<root>/train-<n>.log``."""
    root = study_file.parent
    cmd = ["-m", "lorarl.cli", "run", str(study_file), "s3", "--stages", "train", "--results", str(root),
           "--threads", "1"]
    if nproc > 1:
        cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] + cmd  # a free port
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "LORARL_FAULT")}
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env={**env, **env_vars},
                          timeout=900)
    n = len(list(root.glob("train-*.log")))
    (root / f"train-{n}.log").write_text(proc.stdout + proc.stderr)
    assert (proc.returncode == 0) == expect_ok, proc.stderr[-4000:]
    return root / "dist" / "s3"


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_test_base: Path) -> tuple[Path, Path]:
    return build_models(tmp_path_factory.mktemp("dist_models"), tiny_test_base)


@pytest.mark.slow
def test_two_ranks_train_the_one_process_lora_cell(models, tmp_path: Path):
    """Two PPO mini-batches per rollout: each rank trains its half of the one-process mini-batch; DAPO dynamic
    sampling refills the batch with the one process's rounds and groups (the test hook flattens the rewards
    of about half the prompts, so groups go degenerate the same way on 1 and 2 ranks)."""
    import pandas as pd

    base, teacher = models
    cfg = dict(adapter={"rank": 2, "alpha": 4}, mini_batch_prompts=1, dynamic_sampling=True)
    one = train(study(tmp_path / "one", teacher, base, **cfg), 1, LORARL_FAULT="flat_prompts:2")
    two = train(study(tmp_path / "two", teacher, base, **cfg), 2, LORARL_FAULT="flat_prompts:2")
    assert_same_cell(one, two, {})
    a, b = pd.read_csv(one / "metrics.csv"), pd.read_csv(two / "metrics.csv")
    refill = ["dynamic_sampling/rounds", "dynamic_sampling/frac_groups_dropped", "dynamic_sampling/frac_groups_degenerate"]
    assert a[refill].equals(b[refill]), (a[refill], b[refill])
    assert (a["dynamic_sampling/rounds"] > 1).any() and (a["dynamic_sampling/frac_groups_dropped"] > 0).any()
    assert not (tmp_path / "two" / "dist" / ".checkpoints" / "s3").exists()
    shutil.rmtree(tmp_path)


@pytest.mark.slow
def test_two_ranks_train_the_one_process_full_fine_tuning_cell(models, tmp_path: Path):
    """Full fine-tuning on two ranks: FSDP2 (each rank holds a shard of every parameter and its AdamW state),
    killed at the end of step 2 and resumed from step 1's checkpoint: the sharded weights and optimiser
    states come back exactly, so the cell still equals the one-process cell."""
    import json
    import re

    import torch

    base, teacher = models
    cfg = dict(adapter={"method": "full"}, lr=1e-5, checkpoint_every=1, evaluate={"eval_every": 1})  # a snapshot
    one = train(study(tmp_path / "one", teacher, base, **cfg), 1)
    two_study = study(tmp_path / "two", teacher, base, **cfg)
    train(two_study, 2, expect_ok=False, LORARL_FAULT="kill_at_step:2")
    two = train(two_study, 2)
    assert json.loads((two / "summary.json").read_text())["resumed_from_steps"] == [1]
    assert_same_cell(one, two, weights(base, adapter=False))
    snap_one, snap_two = (weights(c / "snapshots" / "step-1", adapter=False) for c in (one, two))  # gathered
    assert snap_one.keys() == snap_two.keys() and "lm_head.weight" not in snap_two  # tied: saved once, as 1 rank
    for k in snap_one:
        torch.testing.assert_close(snap_two[k], snap_one[k], rtol=1e-5, atol=1e-5)
    for log in ("train-0.log", "train-1.log"):  # both attempts: every rank held a shard, not the whole model
        lines = re.findall(r"rank (\d): FSDP2 over 2 ranks: (\d+) of (\d+) parameter elements held",
                           (tmp_path / "two" / log).read_text())
        assert sorted(r for r, _, _ in lines) == ["0", "1"], log
        assert all(0 < int(held) < int(total) for _, held, total in lines), lines
        assert sum(int(held) for _, held, _ in lines) >= int(lines[0][2]), lines  # the shards cover the model
    assert "FSDP2" not in (tmp_path / "one" / "train-0.log").read_text()  # one process: nothing to shard
    shutil.rmtree(tmp_path)


def launch(study_file: Path, slurm: str = '{"tasks_per_node": 2}', attempt: int = 1,
           **env) -> tuple[subprocess.CompletedProcess, float]:
    """`lorarl launch train` on the local executor with 2 tasks: submitit's ranks, as a Slurm job of 2 tasks."""
    import time

    root = study_file.parent
    cmd = [sys.executable, "-m", "lorarl.cli", "launch", "train", str(study_file), "s3", "--results", str(root),
           "--executor", "local", "--threads", "1", "--slurm", slurm, "--tracking", "sqlite", f"--attempt={attempt}"]
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT", "LORARL_FAULT")}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**clean, **env}, timeout=900)
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_a_killed_rank_fails_the_two_task_job_in_bounded_time_and_the_rerun_resumes(models, tmp_path: Path):
    """A PiSSA cell with ``train.sharding: fsdp2`` (an adapter cell on a sharded frozen base): rank 0 killed, the
    job fails in bounded time; the rerun resumes both ranks' shards and saves the residual-converted adapter from
    the gathered weights."""
    import json
    import re

    import mlflow
    import pandas as pd

    base, teacher = models
    study_file = study(tmp_path, teacher, base, {"rank": 2, "alpha": 4, "init": "pissa"}, steps=3,
                       checkpoint_every=1, sharding="fsdp2")
    # rank 0 is SIGKILLed at the end of step 2 (checkpoint 1 complete); rank 1 waits in a collective until
    # the collective timeout, then fails: the job fails instead of hanging
    killed, took = launch(study_file, LORARL_FAULT="kill_at_step:2", LORARL_COLLECTIVE_TIMEOUT_S="30")
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert took < 300, took
    logs = tmp_path / "dist" / "s3" / "logs" / "train"
    assert "Error" in "".join(p.read_text() for p in logs.glob("*_1_log.err"))  # rank 1 failed too (no hang)
    assert not (tmp_path / "dist" / "s3" / "summary.json").exists()

    done, _ = launch(study_file)
    assert done.returncode == 0, done.stderr[-4000:]
    cell = tmp_path / "dist" / "s3"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["resumed_from_steps"] == [1] and summary["steps"] == 3
    assert pd.read_csv(cell / "metrics.csv")["step"].tolist() == [1, 2, 3]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["train.ranks"] == "2" and run.info.status == "FINISHED"
    for key in ("loss", "reward", "grad_norm"):  # every step logged once, across the kill
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [1, 2, 3], key
    held = re.findall(r"rank (\d): FSDP2 over 2 ranks: (\d+) of (\d+)", "".join(
        p.read_text() for p in logs.glob("*_log.out")))
    assert sorted({r for r, _, _ in held}) == ["0", "1"] and all(int(h) < int(t) for _, h, t in held), held
    assert (cell / "adapter" / "adapter_model.safetensors").exists()  # residual-converted from gathered weights


@pytest.mark.slow
def test_the_last_out_of_memory_retry_runs_on_the_larger_layout_the_profile_allows(models, tmp_path: Path):
    """A model that fits only on 2 ranks (test hook oom_ranks_below:2: a job of one rank runs out of memory,
    tests/pipeline/test_oom_retry.py): attempts 1-3 ran out of memory on one rank (their records written here); attempt 4
    runs on the profile's `layouts.on_oom` layout, 2 tasks, and trains the cell; its summary names the ranks."""
    import json

    from lorarl.pipeline.jobs import oom

    base, teacher = models
    study_file = study(tmp_path, teacher, base, {"rank": 2, "alpha": 4}, steps=1)
    profile = json.dumps({"layouts": {"on_oom": {"tasks_per_node": 2}}})
    logs = tmp_path / "dist" / "s3" / "logs" / "train"
    logs.mkdir(parents=True)
    error = "torch.OutOfMemoryError: CUDA out of memory: 1 rank(s) < 2 (test hook LORARL_FAULT=oom_ranks_below:2)"
    (logs / oom.RECORD).write_text(json.dumps([{"attempt": k, "oom": True, "error": error, "failed": None}
                                               for k in (1, 2, 3)]))
    refused, _ = launch(study_file, attempt=4, LORARL_FAULT="oom_ranks_below:2")  # no on_oom: refused
    assert refused.returncode == 1 and "no larger layout allowed by the profile" in refused.stderr
    last, _ = launch(study_file, profile, attempt=4, LORARL_FAULT="oom_ranks_below:2")
    assert last.returncode == 0, last.stderr[-4000:]
    assert "retrying on the larger layout the profile allows: 2 ranks (1 node(s))" in last.stdout
    summary = json.loads((tmp_path / "dist" / "s3" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["oom_retries"][-1]["attempt"] == 4
    assert summary["oom_retries"][-1]["ranks"] == 2 and "ranks" not in summary["oom_retries"][0]
    assert len(list(logs.glob("*_1_log.out"))) == 1  # the second task's log: one job of 2 tasks
    shutil.rmtree(tmp_path)
