"""The memory plan of a multi-GPU layout (lorarl.memory.layout): FSDP2 shards weights, gradients and optimiser
states by the world size exactly, DDP replicates them; each rank plans its share of the batch; the strategy
the trainer is meant to pick; the smallest layout that fits; `lorarl memory --gpus N --nodes M`."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
from pathlib import Path

import pytest

from lorarl.cli import main
from lorarl.memory import PlanError, plan_cell
from lorarl.memory.layout import Layout, layouts, smallest_layout, smallest_study_layout, strategy_for  # re-exported
from lorarl.memory.plan import fsdp_gather_bytes, shape_of, static_parts
from lorarl.memory.report import COLUMNS
from lorarl.language.study import load_study, study_cells

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SHARDED = ("weights", "trainable_state", "reference")


def cell(study: str, **where) -> object:
    for c in study_cells(load_study(EXPERIMENTS / study)):
        if all(getattr(c.config.adapter, k) == v for k, v in where.items()):
            return c.config
    raise AssertionError(f"{study}: no cell with {where}")


def with_train(cfg, **train):
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("world", [2, 4, 8, 32])
def test_fsdp2_shards_states_by_the_world_size_exactly_ddp_does_not(method, world):
    shape, _ = shape_of(cell("peft_zoo.yaml", method=method))
    one = static_parts(shape, True)
    fsdp = static_parts(replace(shape, world=world, strategy="fsdp2"), True)
    ddp = static_parts(replace(shape, world=world, strategy="ddp"), True)
    for part in SHARDED:
        assert fsdp[part] == one[part] / world  # exactly 1/W: parameters, gradients, AdamW moments, reference
        assert ddp[part] == one[part]  # a full replica on every rank
    assert fsdp["fsdp_gather"] == fsdp_gather_bytes(shape) > 0  # the unsharded buffers do not shrink with W
    a = shape.arch
    layer = sum(i * o for _, i, o in a.linears()) + 2 * a.hidden
    root = a.vocab * a.hidden * (1 if a.tie_embeddings else 2) + a.hidden
    assert fsdp["fsdp_gather"] == (root + layer) * 2 * (2 if method == "full" else 1)  # bf16, + grads for full FT
    assert ddp["ddp_buckets"] == shape.trainable * 4  # the reducer's fp32 gradient buckets
    assert "ddp_buckets" not in one and "fsdp_gather" not in one


# (study, adapter, GPUs per node, nodes): ranks, strategy, rows per rank
LAYOUTS = [
    ("peft_zoo.yaml", "full", 1, 1, 1, "single", 128),
    ("peft_zoo.yaml", "full", 2, 1, 2, "fsdp2", 64),
    ("peft_zoo.yaml", "full", 8, 2, 16, "fsdp2", 8),
    ("peft_zoo.yaml", "lora", 8, 1, 8, "ddp", 16),
    ("init_geometry.yaml", "lora", 8, 1, 8, "ddp", 32),
    ("init_geometry.yaml", "lora", 4, 4, 16, "ddp", 16),
]


@pytest.mark.parametrize("study,method,gpus,nodes,ranks,strategy,rank_rows", LAYOUTS)
def test_each_rank_plans_its_share_of_the_batch(study, method, gpus, nodes, ranks, strategy, rank_rows):
    cfg = with_train(cell(study, method=method), micro_batch_size=None)  # the whole share per micro-batch
    single = plan_cell(cfg, 80)
    p = plan_cell(cfg, 80, gpus=gpus, nodes=nodes)
    assert (p.ranks, p.strategy, p.rank_rows, p.rows) == (ranks, strategy, rank_rows, single.rows)
    assert p.micro_batch == rank_rows and p.batch == single.batch
    if ranks > 1:
        assert p.peak_gb < single.peak_gb  # fewer rows' activations per GPU


def test_strategy_the_trainer_picks():
    assert strategy_for("lora", 1, 1e12, 1.0) == "single"  # one rank: no wrapper whatever it holds
    assert strategy_for("full", 2, 0.0, 1.0) == "fsdp2"
    assert strategy_for("lora", 8, 0.5, 1.0) == "ddp"
    assert strategy_for("lora", 8, 2.0, 1.0) == "fsdp2"  # a replica does not fit: shard the base
    # Qwen2.5-7B LoRA on 16 GiB GPUs: bf16 weights + reference alone exceed a GPU, so FSDP2 on 8 ranks
    cfg = cell("peft_zoo_7b.yaml", method="lora")
    assert plan_cell(cfg, 16, gpus=8).strategy == "fsdp2" and plan_cell(cfg, 80, gpus=8).strategy == "ddp"


def test_a_running_job_runs_the_planned_strategy_and_train_sharding_overrides_it(monkeypatch):
    """train.sharding auto: the job's plan resolves it (FSDP2 for full fine-tuning, and for an adapter cell whose
    replica exceeds the GPU; else DDP), so a running job is sized by the strategy it runs; ddp / fsdp2 as set."""
    from lorarl.memory.auto import resolve_job

    cfg = with_train(cell("peft_zoo.yaml", method="full"), micro_batch_size=None)
    planned, running = plan_cell(cfg, 80, gpus=2), plan_cell(cfg, 80, gpus=2, world=2)
    assert (planned.strategy, running.strategy) == ("fsdp2", "fsdp2") and running.parts_gb == planned.parts_gb
    single = plan_cell(cfg, 80, gpus=1)
    assert running.parts_gb["trainable_state"] == pytest.approx(single.parts_gb["trainable_state"] / 2, abs=0.01)
    ddp = plan_cell(with_train(cfg, sharding="ddp"), 80, gpus=2)
    assert ddp.strategy == "ddp" and ddp.parts_gb["trainable_state"] > 1.9 * planned.parts_gb["trainable_state"]
    assert strategy_for("lora", 8, 2.0, 1.0, "ddp") == "ddp" and strategy_for("lora", 8, 0.5, 1.0, "fsdp2") == "fsdp2"
    lora7 = cell("peft_zoo_7b.yaml", method="lora")  # bf16 weights + reference exceed a 16 GiB GPU
    assert plan_cell(lora7, 16, gpus=8).strategy == "fsdp2" and plan_cell(lora7, 80, gpus=8).strategy == "ddp"
    monkeypatch.setenv("WORLD_SIZE", "8")
    gib = 1024 ** 3
    assert resolve_job(lora7, gpus=1, free_bytes=16 * gib, log=lambda s: None).train.sharding == "fsdp2"
    assert resolve_job(lora7, gpus=1, free_bytes=80 * gib, log=lambda s: None).train.sharding == "ddp"
    assert resolve_job(lora7, gpus=0, log=lambda s: None).train.sharding == "ddp"  # CPU ranks: no budget
    assert resolve_job(cfg, gpus=0, log=lambda s: None).train.sharding == "fsdp2"
    assert resolve_job(with_train(lora7, sharding="fsdp2"), gpus=0, log=lambda s: None).train.sharding == "fsdp2"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert resolve_job(lora7, gpus=0, log=lambda s: None).train.sharding == "auto"  # one process: nothing to shard


def test_smallest_layout_is_the_fewest_gpus_that_fit():
    assert [str(x) for x in layouts(4, 3)] == ["1 node(s) x 1 GPU(s)", "1 node(s) x 2 GPU(s)", "1 node(s) x 3 GPU(s)",
                                               "1 node(s) x 4 GPU(s)", "2 node(s) x 4 GPU(s)", "3 node(s) x 4 GPU(s)"]
    lora7 = cell("peft_zoo_7b.yaml", method="lora")  # full fine-tuning of Qwen2.5-7B: fp32 master, grads, moments
    full7 = lora7.model_copy(update={"adapter": lora7.adapter.model_copy(update={"method": "full"})})
    assert not plan_cell(full7, 80).fits
    got = smallest_layout(full7, 80, gpus_per_node=8, max_nodes=2)
    assert got is not None and got.fits and got.strategy == "fsdp2"
    fewer = [x for x in layouts(8, 2) if x.gpus < got.gpus * got.nodes and 32 % x.gpus == 0]
    assert fewer and not any(plan_cell(full7, 80, gpus=x.gpus_per_node, nodes=x.nodes).fits for x in fewer)
    assert smallest_layout(full7, 8, gpus_per_node=2, max_nodes=1) is None  # nothing that small fits
    lora = cell("peft_zoo.yaml", method="lora")
    assert (smallest_layout(lora, 80).gpus, smallest_layout(lora, 80).ranks) == (1, 1)
    # paper 001's distillation cell on 24 GiB: the teacher needs the second GPU of a 2-GPU node (1 rank)
    distil = next(c.config for c in study_cells(load_study(EXPERIMENTS / "reward_density.yaml"))
                  if c.id == "distillation-r1-s0")
    two = smallest_layout(distil, 24)
    assert (two.gpus, two.nodes, two.ranks) == (2, 1, 1) and two.aux_gpu_gb > 15
    # the whole study: one layout for every cell shape; on 24 GiB none (full fine-tuning + a teacher per rank)
    assert smallest_study_layout(str(EXPERIMENTS / "reward_density.yaml"), 24) is None
    lay, plans = smallest_study_layout(str(EXPERIMENTS / "reward_density.yaml"), 40)
    assert lay == Layout(2, 1) and all(p.fits for p in plans)
    by = {p.cell: p for p in plans}
    assert (by["outcome-rfull-s0"].ranks, by["outcome-rfull-s0"].strategy) == (2, "fsdp2")
    assert (by["distillation-rfull-s0"].ranks, by["distillation-rfull-s0"].strategy) == (1, "single")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["memory", *argv])
    return rc, out.getvalue(), err.getvalue()


def test_cli_prints_one_ranks_peak_and_micro_batch_for_the_layout(tmp_path):
    study = str(EXPERIMENTS / "peft_zoo.yaml")
    rc, out, _ = run_cli(study, "--gpus", "8", "--nodes", "2", "--cell", "full")
    assert rc == 0 and "2 node(s) x 8 GPU(s)" in out
    got = dict(zip(COLUMNS, out.splitlines()[2].split()))  # no value holds a space
    assert (got["ranks"], got["strategy"], got["rows/rank"], got["micro"]) == ("16", "fsdp2", "8", "8")
    prof = tmp_path / "multi"
    prof.mkdir()
    (prof / "config.yaml").write_text("config:\n  launcher: slurm\n  slurm: {train: {gpus_per_node: 4, nodes: 2}}\n")
    rc, out, _ = run_cli(study, "--profile", str(prof), "--cell", "lora")
    assert rc == 0 and "2 node(s) x 4 GPU(s)" in out and dict(zip(COLUMNS, out.splitlines()[2].split()))["ranks"] == "8"
    (prof / "config.yaml").write_text("config:\n  launcher: slurm\n  slurm: {train: {nodes: many}}\n")
    rc, _, err = run_cli(study, "--profile", str(prof))
    assert rc == 2 and "slurm.train.nodes" in err
    with pytest.raises(PlanError, match="nodes"):
        Layout(1, 0)


def test_auto_knobs_are_per_rank_under_torchrun(monkeypatch):
    from lorarl.memory.auto import resolve_job
    from lorarl.memory.plan import GIB

    cfg = cell("init_geometry.yaml", method="lora")  # micro_batch_size auto; 256 rows per update
    monkeypatch.setenv("WORLD_SIZE", "16")
    got = resolve_job(cfg, gpus=8, free_bytes=80 * GIB, log=lambda s: None)
    per_rank = plan_cell(cfg, 80, gpus=8, world=16)
    assert per_rank.rank_rows == 16 and got.train.micro_batch_size == per_rank.max_micro_batch <= 16
    monkeypatch.delenv("WORLD_SIZE")  # one process (today's trainer): the whole update on this GPU
    assert resolve_job(cfg, gpus=8, free_bytes=80 * GIB, log=lambda s: None).train.micro_batch_size == \
        plan_cell(cfg, 80, world=1).max_micro_batch == 13  # beside its colocated vLLM engine (30% of the GPU)


PUBLISHED = sorted(p for p in EXPERIMENTS.glob("*.yaml")
                   if not p.stem.endswith("_cpu") and p.stem not in ("demo", "demo_adaptive", "kl_bound_toy"))


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_fidelity_layout_row_is_the_smallest_layout_on_the_papers_gpu(path):
    import re

    rows = [line for line in path.read_text().splitlines() if line.startswith("# | layout |")]
    assert len(rows) == 1, f"{path.name}: one fidelity row 'layout' (the paper's layout and lorarl's)"
    got = re.search(r"smallest layout on (\d+) GiB: (\d+) node\(s\) x (\d+) GPU\(s\)", rows[0])
    assert got, rows[0]
    gb, nodes, gpus = (int(x) for x in got.groups())
    lay, plans = smallest_study_layout(str(path), gb)
    assert (lay.nodes, lay.gpus_per_node) == (nodes, gpus) and plans and all(p.fits for p in plans)


def test_rollout_tensor_parallel_size_is_a_layout_knob_capped_by_the_jobs_ranks():
    """rollout.tensor_parallel_size: runtime (the cell's hash is the one of 1, as before the knob existed),
    resolved per job to a divisor of its ranks, refused by name with the HF engine."""
    from pydantic import ValidationError

    from lorarl.language.config import RolloutConfig
    from lorarl.memory.auto import resolve_job
    from lorarl.language.signature import train_signature

    base = cell("peft_zoo.yaml", method="lora")
    vllm = base.model_copy(update={"rollout": base.rollout.model_copy(update={"engine": "vllm"})})
    tp = {t: vllm.model_copy(update={"rollout": vllm.rollout.model_copy(update={"tensor_parallel_size": t})})
          for t in (1, 2, 4)}
    assert len({train_signature(c) for c in tp.values()}) == 1
    seen = []
    for t, world, want in ((2, 1, 1), (2, 2, 2), (4, 2, 2), (4, 6, 2), (4, 8, 4), (1, 8, 1)):
        got = resolve_job(tp[t], gpus=0, world=world, log=seen.append).rollout.tensor_parallel_size
        assert got == want, (t, world, got)
    assert "[lorarl] memory plan: rollout.tensor_parallel_size 2 -> 1 (1 ranks)" in seen
    with pytest.raises(ValidationError, match="rollout.tensor_parallel_size 2 needs rollout.engine 'vllm'"):
        RolloutConfig(tensor_parallel_size=2)
