"""A vLLM cell on two ranks equals the one-process cell (lorarl.train.vllm_seeds): ``torchrun --nproc_per_node 2``
(gloo) runs one colocated vLLM CPU engine per rank (or one engine over both, tensor-parallel), each sampling its
half of the generation batch with one request seed per row, so the rollouts, the metrics step by step and the final
adapter are the one process's (1e-5).

The push paths: DDP ranks (an adapter cell's default on several ranks) in the tensor-parallel test, FSDP2 ranks with
an engine each in the two FSDP2 tests. A DDP cell with an engine per rank has no test of its own: it is the
tensor-parallel test's push with the FSDP2 tests' engines, and running it cost CI two minutes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.distributed import STEPS, assert_same_cell, weights
from tests.support.study import seeds, tiny_study


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """Two untrained models of the ``local:tiny-arith`` shape (head_dim 32, as vLLM's CPU kernels need): the
    policy's base and a distillation teacher of other weights (dense rewards that differ from row to row)."""
    import torch

    from lorarl.models import RECIPES, build_tiny, build_tokenizer
    from lorarl.tasks.synthetic import make_splits

    root = tmp_path_factory.mktemp("vllm_ranks")
    recipe = RECIPES["tiny-arith"]
    train, _ = make_splits(recipe.task_seed, 200, 1, max_ops=recipe.max_operands, max_value=recipe.max_value)
    tok = build_tokenizer([p.prompt + p.solution for p in train] + ["0123456789+-=?\nQA: \\boxed{}"])
    net = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    net.generation_config.eos_token_id, net.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    net.save_pretrained(root / "tiny-arith")
    tok.save_pretrained(root / "tiny-arith")
    gen = torch.Generator().manual_seed(0)  # the teacher: a perturbed copy (build_tiny seeds itself)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    net.save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    return root / "tiny-arith", root / "teacher"


def train(root: Path, models: tuple[Path, Path], nproc: int, tp: int = 1, adapter: dict | None = None,
          lr: float = 1e-3, sharding: str = "auto") -> Path:
    model, teacher = models
    (root / "models").mkdir(parents=True)
    os.symlink(model, root / "models" / "tiny-arith")
    spec = tiny_study("dist", eval=None, model="local:tiny-arith", task={"name": "synthetic", "n_train": 32, "n_eval": 8},
                      adapter=adapter or {"rank": 2, "alpha": 4},
                      train={"steps": STEPS, "prompts_per_step": 2, "generations": 2, "max_completion_length": 10,
                             "lr": lr, "beta": 0.05, "kl_monitor_every": 1, "checkpoint_every": 0, "sharding": sharding},
                      rollout={"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True,
                               "tensor_parallel_size": tp},
                      reward={"regime": "distillation", "teacher": str(teacher)},  # dense, varied rewards: it learns
                      axes=seeds(3))
    (root / "study.yaml").write_text(yaml.safe_dump(spec))
    cmd = ["-m", "lorarl.cli", "run", str(root / "study.yaml"), "s3", "--stages", "train", "--results", str(root),
           "--threads", "1"]
    if nproc > 1:
        cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] + cmd
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "LORARL_FAULT")}
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env, timeout=900)
    (root / "train.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "dist" / "s3"


@pytest.fixture(scope="module")
def one_process(models, tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("one"), models, 1, tp=2)  # a layout knob: resolved to 1 on one rank


def assert_same_rollouts(one: Path, two: Path, start: dict | None = None) -> None:
    import pandas as pd

    assert_same_cell(one, two, start or {})
    a, b = pd.read_csv(one / "metrics.csv"), pd.read_csv(two / "metrics.csv")
    for key in ("rollout/logp_diff_mean", "rollout/logp_diff_max"):  # the sampler's logprobs: the whole batch's
        assert (a[key] - b[key]).abs().max() <= 1e-5, (key, a[key].tolist(), b[key].tolist())
    assert (a["rollout/logp_diff_mean"] < 0.05).all()  # the engines sampled the trained policy
    assert (a["grad_norm"] > 1e-3).all()  # it learned: the comparison can fail


def test_two_ranks_sharing_one_tensor_parallel_engine_train_the_one_process_vllm_cell(models, one_process, tmp_path):
    """``rollout.tensor_parallel_size: 2``: both ranks form one TP group (TRL's), one engine sharded over them; a
    runtime knob: the same cell (hash) as the one-process run, which resolves it to 1."""
    two = train(tmp_path / "two", models, 2, tp=2)
    assert_same_rollouts(one_process, two)
    assert "rollout.tensor_parallel_size 2 -> 1 (1 ranks)" in (one_process.parents[1] / "train.log").read_text()
    shutil.rmtree(tmp_path)


def test_full_fine_tuning_on_two_fsdp2_ranks_pushes_the_gathered_weights_to_each_engine(models, tmp_path: Path):
    """Full fine-tuning with vLLM on 2 ranks: FSDP2 (train.sharding auto), each rank gathers every parameter
    whole (a collective) and pushes it to its own engine; equals the one-process cell."""
    full = {"method": "full"}  # lr 1e-4: AdamW turns an element's gradient near its eps into a step of ~lr whatever
    # its rounding, so the weights agree to ~1% of lr (1e-3 left one element of 16,384 at 1.2e-5)
    one = train(tmp_path / "one", models, 1, adapter=full, lr=1e-4)
    two = train(tmp_path / "two", models, 2, adapter=full, lr=1e-4)
    assert_same_rollouts(one, two, weights(models[0], adapter=False))
    log = (tmp_path / "two" / "train.log").read_text()
    assert log.count("FSDP2 over 2 ranks") >= 2 and log.count("vLLM rollouts:") == 2  # shards, an engine per rank
    shutil.rmtree(tmp_path)


def test_an_adapter_cell_on_two_fsdp2_ranks_pushes_its_merged_weights_to_each_engine(models, one_process, tmp_path):
    """LoRA on a sharded base (``train.sharding: fsdp2``, runtime: the same cell): each rank unshards the model for
    the push, merges the adapter into the whole weights, pushes them to its engine and reshards."""
    two = train(tmp_path / "two", models, 2, sharding="fsdp2")
    assert_same_rollouts(one_process, two)
    log = (tmp_path / "two" / "train.log").read_text()
    assert log.count("FSDP2 over 2 ranks") >= 2 and log.count("vLLM rollouts:") == 2
    shutil.rmtree(tmp_path)
