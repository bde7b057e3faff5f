"""The solo job: one cell, TRL's GRPOTrainer + PEFT, hosted for its run (lorarl.train.cellrun).

TRL does the RL. The job resolves the cell's inputs at the door (lorarl.train.prepare), the cell's run owns
its lock, checkpoints, MLflow run, metrics, monitors and outputs (written atomically: a crash never leaves a
file that looks done), and this module only wires the two to the trainer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lorarl.train.prepare import job_config


def train_cell(study: str, cell: Any, results_dir: str | Path = "results", threads: int | None = None, *,
               config: Any = None, stop_at: int | None = None, invocation: str | None = None) -> dict:
    """Train one cell and write cell.json, metrics.csv, adapter/, summary.json (summary last). ``config``:
    the cell's config resolved for this job (``auto`` knobs, teacher/PRM devices) by whoever starts the
    job; the trainer resolves nothing itself. ``stop_at``: end paused at that training step, full state
    saved, nothing published (lorarl.train.cellrun). On several ranks (torchrun, submitit's tasks:
    lorarl.train.ranks.init) every rank trains its share and rank 0 alone writes files and MLflow
    (lorarl.train.ranks); the other ranks return ``{"cell", "rank"}``."""
    import torch

    from lorarl import jobclock
    from lorarl.adapters import build_adapter
    from lorarl.train import ranks
    from lorarl.train.cellrun import CellRun
    from lorarl.train.hf_host import HFHost
    from lorarl.train.prepare import prepare
    from lorarl.train.rollout import check_engine
    from lorarl.train.sharding import gathered_state_dict
    from lorarl.train.trl_args import build_trainer

    if threads:
        torch.set_num_threads(threads)
    ranks.init()  # several ranks: join the job's process group (collective timeout) before any GPU work
    cfg = job_config(cell, config)  # resolved where the job starts (auto knobs, teacher/PRM devices)
    check_engine(cfg.rollout)  # engine vllm without a GPU/vllm: clear error before anything is written
    # the cell's lock and checkpoints (results/<study>/.checkpoints/<cell>/): rank 0 owns them, the others follow
    run = CellRun(study, cell, results_dir, cfg, main=ranks.is_main(), stop_at=stop_at, invocation=invocation)
    if run.done is not None:  # its outputs in place: another job trained it (waited for, or a late duplicate)
        return run.done
    inputs = prepare(cfg, results_dir, output_dir=run.checkpoints.root)  # policy, reference, data, regime, TRL args
    # lorarl.adapters: method x init x mask from the registry, fingerprinted (fails loudly on a mismatch)
    policy = build_adapter(inputs.model, cfg, results_dir=results_dir, precision=inputs.precision)
    svd = policy.fingerprint.get("svd_cache")
    if svd:  # SVD inits: one on-disk cache, a file lock per module: each module's SVD is computed by one rank
        print(f"[lorarl] rank {ranks.rank()}: SVD cache: {svd['misses']} computed, {svd['hits']} read "
              f"({svd['svd_seconds']:.1f} s of SVD)", flush=True)
    resume = run.open(inputs.precision, save=policy.save, tokenizer=inputs.tokenizer,  # MLflow run, rows, snapshots
                      params={"train.ranks": ranks.world_size()})
    host = HFHost(run, resume, inputs.sharded)  # the Trainer's callbacks -> the run's door (lorarl.train.hf_host)
    t0 = time.perf_counter()
    trainer = build_trainer(  # regime deposits → [B, T] advantages, own KL term (lorarl.train.trainer)
        cfg, model=policy.model, tokenizer=inputs.tokenizer, args=inputs.args, ref_model=inputs.ref_model,
        train_dataset=inputs.dataset, regime=inputs.regime, grading=inputs.grading,
        callbacks=host.callbacks())  # the model is adapted already
    if cfg.rollout.engine == "vllm":  # TRL built its colocated engine in there: the job's start-up, no step's
        jobclock.startup("engine", time.perf_counter() - t0)
    policy.attach(trainer)  # method's optimiser (LoRA+/LoRA-FA/mask) + callbacks; re-verify
    host.attach(trainer)  # divergence stop, checkpoints, rank sync, monitor state
    host.train(trainer)  # resumes from the cell's checkpoint; Slurm's USR2: checkpoint, then requeue
    weights = gathered_state_dict(trainer)  # FSDP2: the full weights, gathered by every rank (else None)
    return run.close(policy, trainer.model, facts=inputs.data_facts, state_dict=weights, tokenizer=inputs.tokenizer)
