"""The thin trainer: cell config → model + adapter + reward → TRL GRPOTrainer → per-cell files.

TRL does the RL. This module only translates the cell config, wires the reward and the metrics
recorder, and writes the cell's outputs atomically (a crash never leaves a file that looks done).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from lorarl.train import flags as flagmod
from lorarl import paths
from lorarl.io import write_json as _write_json
from lorarl.config import CellConfig
from lorarl.study import Cell


def load_policy(cfg: CellConfig, results_dir: str | Path, device: str, precision: str | None = None
                ) -> tuple[Any, Any]:
    """Base model + tokenizer, loaded in the dtype ``train.precision`` asks for (lorarl.train.precision)."""
    import torch

    from lorarl.models import load_model_and_tokenizer, resolve_model
    from lorarl.train.precision import load_dtype, resolve_precision

    torch.manual_seed(cfg.seed)
    precision = precision or resolve_precision(cfg.train.precision, device)
    dtype = load_dtype(precision, cfg.adapter.method)
    return load_model_and_tokenizer(resolve_model(cfg.model, results_dir), dtype=dtype, device=device)


def training_dataset(cfg: CellConfig, tokenizer: Any) -> tuple[Any, dict]:
    """The train split as TRL's dataset: ``prompt`` = the cell's prompt (lorarl.tasks.prompt, the
    one evaluation uses), ``answer`` = the gold; prompts over ``train.max_prompt_length`` tokens are
    dropped (or, ``train.prompt_overflow: truncate_left``, cut in the trainer and counted here).
    Returns (dataset, facts for the summary)."""
    import datasets

    from lorarl.tasks import task_records
    from lorarl.tasks.prompt import prompt_ids, training_prompts, uses_chat_template, within_length
    from lorarl.train.prompt_fit import prompt_keep

    rows, _ = task_records(cfg.task)
    prompts = training_prompts(cfg, [r["prompt"] for r in rows], tokenizer)
    keep = within_length(cfg, prompts, tokenizer)
    data = [{"prompt": p, "answer": r["answer"]} for p, r, k in zip(prompts, rows, keep) if k]
    if not data:
        raise ValueError(f"train.max_prompt_length={cfg.train.max_prompt_length}: every training prompt is longer")
    keep = prompt_keep(cfg.train)
    facts = {"prompts_dropped_too_long": len(rows) - len(data),
             **({"prompts_truncated_left": sum(len(prompt_ids(tokenizer, d["prompt"], cfg.prompt)) > keep for d in data)}
                if keep is not None else {}),
             "prompt_chat_template": uses_chat_template(cfg.prompt.chat_template, tokenizer)}
    return datasets.Dataset.from_list(data), facts


def _finished_meanwhile(ckpt: Any, final: Path, cell: Cell) -> dict | None:
    """After waiting for another job's lock on this cell: its summary, if that job finished it."""
    if not ckpt.waited_for_lock:
        return None
    try:
        summary = json.loads((final / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.get("config_hash") != cell.hash:
        return None
    print(f"[lorarl] cell {cell.id} was trained by the job this one waited for; nothing to do", flush=True)
    ckpt.release()
    return summary


RUNTIME_KNOBS = (("train", "micro_batch_size"), ("rollout", "generation_batch_size"))  # may be `auto` in a study


def job_config(cell: Cell, config: CellConfig | None) -> CellConfig:
    """The config this job trains with: ``config`` (the cell's, resolved for the job's GPUs where the job
    starts: lorarl.memory.auto.resolve_job), else the cell's own; either way with no ``auto`` left."""
    cfg = cell.config if config is None else config
    left = [f"{sec}.{name}" for sec, name in RUNTIME_KNOBS if getattr(getattr(cfg, sec), name) == "auto"]
    if left:
        raise ValueError(f"cell {cell.id}: {', '.join(left)} still auto; the job resolves it before training "
                         "(lorarl.memory.auto.resolve_job / job_cell, called by the stage that starts the job)")
    return cfg


def train_cell(study: str, cell: Cell, results_dir: str | Path = "results", threads: int | None = None, *,
               config: CellConfig | None = None) -> dict:
    """Train one cell and write cell.json, metrics.csv, adapter/, summary.json (summary last). ``config``:
    the cell's config resolved for this job (``auto`` knobs, teacher/PRM devices) by whoever starts the
    job; the trainer resolves nothing itself. On several ranks (torchrun, submitit's tasks:
    lorarl.train.dist) every rank trains its share and rank 0 alone writes files and MLflow
    (lorarl.train.ranks); the other ranks return ``{"cell", "rank"}``."""
    import torch

    from lorarl.train import ranks
    from lorarl.train.rank_checkpoints import FollowerCheckpoints

    from lorarl.adapters import build_adapter
    from lorarl.train.callbacks import MetricsRecorder, NoStepPastTheEnd, ResumedAtEnd
    from lorarl.train.checkpoint import CellCheckpoints
    from lorarl.train.divergence import Divergence
    from lorarl.io import disk_full_hook
    from lorarl.evaluate.plan import snapshot_steps
    from lorarl.train.snapshots import SnapshotSaver
    from lorarl.train.kl import frozen_reference, needs_reference
    from lorarl.train.trl_args import build_trainer, grpo_args
    from lorarl.train.precision import resolve_precision, trainable_dtypes
    from lorarl.train.sharding import gathered_state_dict, uses_fsdp
    from lorarl.tracking.client import Tracker

    if threads:
        torch.set_num_threads(threads)
    ranks.init()  # several ranks: join the job's process group (collective timeout) before any GPU work
    main = ranks.is_main()
    cfg = job_config(cell, config)  # resolved where the job starts (auto knobs, teacher/PRM devices)
    from lorarl.train.rollout import check_engine

    check_engine(cfg.rollout)  # engine vllm without a GPU/vllm: clear error before anything is written
    t_start = time.time()
    final = paths.cell_dir(results_dir, study, cell.id)
    # results/<study>/.checkpoints/<cell>/ (no Snakemake output); rank 0 owns it, the others follow
    ckpt = CellCheckpoints(results_dir, study, cell) if main else FollowerCheckpoints(results_dir, study, cell)
    done = ranks.broadcast(_finished_meanwhile(ckpt, final, cell) if main else None)
    if done is not None:  # a duplicate job waited for the cell's lock: the other one trained it
        return done
    from lorarl.train import until as untilmod  # an adaptive rung: train up to it, keep the checkpoint, publish nothing

    until = untilmod.until_step()
    if until is not None and (ended := untilmod.already_ended(results_dir, study, cell, until)) is not None:
        ckpt.release()
        return untilmod.write_mark(results_dir, study, cell, until, **ended) if main else {"cell": cell.id}
    work = final / ".train.tmp"
    if main:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)

    use_cpu = not torch.cuda.is_available()
    precision = resolve_precision(cfg.train.precision, "cpu" if use_cpu else "cuda")  # logged as resolved
    model, tok = load_policy(cfg, results_dir, "cpu" if use_cpu else "cuda", precision)
    # KL reference = the ORIGINAL base, copied before any adapter (or residual init) touches the weights
    ref_model = frozen_reference(model) if needs_reference(cfg.train.beta, cfg.train.kl_monitor_every) else None
    if ref_model is not None and precision != "fp32":  # frozen: bf16 suffices (halves it under full-FT mixed)
        ref_model.to(torch.bfloat16)
    dataset, data_facts = training_dataset(cfg, tok)

    tracker = Tracker(results_dir, study) if main else None
    flat = cell.flat_config()
    run_id = (ckpt.resume_run(tracker) or tracker.start(  # a requeued/killed cell reopens its own run
        cell.id, run_name=cell.id,
        tags={"lorarl.config_hash": cell.hash, **{f"axis.{k}": v for k, v in cell.axes.items()}},
        params={**flat, "train.precision_resolved": precision, "train.ranks": ranks.world_size()},
    )) if main else None
    run_id, resume_from = ranks.broadcast((run_id, ckpt.resume_from))  # every rank resumes rank 0's choice
    if not main:
        ckpt.resume_from = resume_from
    recorder = MetricsRecorder(work / "metrics.csv", tracker, updates_per_step=cfg.train.updates_per_step,
                               write=main)
    ckpt.restore(recorder, run_id)  # rows trained before a resume; MLflow gets any it missed
    # lorarl.adapters: method x init x mask from the registry, fingerprinted (fails loudly on a mismatch)
    policy = build_adapter(model, cfg, results_dir=results_dir, precision=precision)
    svd = policy.fingerprint.get("svd_cache")
    if svd:  # SVD inits: one on-disk cache, a file lock per module: each module's SVD is computed by one rank
        print(f"[lorarl] rank {ranks.rank()}: SVD cache: {svd['misses']} computed, {svd['hits']} read "
              f"({svd['svd_seconds']:.1f} s of SVD)", flush=True)
    sharded = uses_fsdp(cfg.train.sharding, cfg.adapter.method, ranks.world_size())  # full fine-tuning on several ranks: FSDP2
    snapshots = SnapshotSaver(final / "snapshots", snapshot_steps(cfg), policy.save, tok,  # eval.eval_every
                              updates_per_step=cfg.train.updates_per_step)
    collapse = flagmod.monitor(recorder, cfg.train.stop_on_collapse, cfg.train.updates_per_step)  # early collapse flags (lorarl.train.flags)
    model, peft_cfg = policy.model, None  # already adapted: the trainer must not wrap it again
    trainer = build_trainer(  # regime deposits → [B, T] advantages, own KL term (lorarl.train.trainer)
        cfg, model=model, tokenizer=tok, args=grpo_args(cfg, ckpt.root, use_cpu, precision), ref_model=ref_model,
        train_dataset=dataset, peft_config=peft_cfg, callbacks=[NoStepPastTheEnd(), recorder, *([snapshots] if main or sharded else []), collapse],
        results_dir=str(results_dir),
    )
    if sharded:  # FSDP2: every rank gathers the weights a snapshot saves (lorarl.train.sharding)
        snapshots.gather = functools.partial(gathered_state_dict, trainer)
    counts = policy.attach(trainer)  # method's optimiser (LoRA+/LoRA-FA/mask) + callbacks; re-verify
    divergence = Divergence(cfg.train.updates_per_step)  # NaN/inf loss, reward or gradient: skip that update, stop, state "diverged"
    trainer.add_callback(divergence.callback())
    ckpt.attach(trainer, recorder)  # save every train.checkpoint_every steps and at the end
    stop = untilmod.stopper(until * cfg.train.updates_per_step) if until is not None else None  # save, stop there
    if stop is not None:
        trainer.add_callback(stop)
    at_rung = stop is not None and ranks.broadcast(main and ckpt.resumed is not None and  # already there: train nothing
                                                   ckpt.resumed.step >= until * cfg.train.updates_per_step)
    if main and ranks.world_size() > 1:
        from lorarl.train.rank_checkpoints import attach_sync

        attach_sync(trainer, recorder, ckpt)  # the other ranks save and stop with rank 0
    try:
        with ckpt.preemption():  # Slurm's USR2: finish the step, checkpoint, then submitit requeues
            try:
                if not at_rung:
                    trainer.train(resume_from_checkpoint=ckpt.resume_from)
            except ResumedAtEnd:  # resumed from the last step's checkpoint: nothing left to train
                pass
    except BaseException as err:
        ckpt.release()
        if tracker is not None:
            tracker.finish("KILLED" if isinstance(err, (SystemExit, KeyboardInterrupt)) else "FAILED")
        raise
    over = divergence.state != "done" or collapse.stopped_at is not None  # ended at its rung: it ends as usual
    if stop is not None and ranks.broadcast(main and (at_rung or (stop.reached and not over))):
        out = untilmod.pause(results_dir, study, cell, until, run_id, ckpt, tracker, recorder, work) if main else {}
        ranks.barrier()
        return out
    recorder.flush()
    weights = gathered_state_dict(trainer)  # FSDP2: the full weights, gathered by every rank (else None)
    if not main:  # rank 0 writes the cell's outputs
        ranks.barrier()
        return {"cell": cell.id, "rank": ranks.rank()}
    if collapse.stopped_at is not None or (until is not None and divergence.state != "done"):  # ended before
        snapshots.fill_after_stop(trainer.model, weights)  # its last snapshot (or rung): those steps = final policy
    policy.save(work / "adapter", trainer.model, state_dict=weights)  # residual inits saved relative to the original base
    if cfg.adapter.method == "full":
        tok.save_pretrained(work / "adapter")
    shutil.rmtree(work / "trainer", ignore_errors=True)

    rewards = [r["reward"] for r in recorder.rows if "reward" in r and math.isfinite(r["reward"])]
    tail = rewards[-max(1, len(rewards) // 10):]
    summary = {
        "study": study, "cell": cell.id, "config_hash": cell.hash, "mlflow_run_id": run_id,
        **divergence.summary(),  # "state": "done" | "diverged" (+ diverged_at_step, diverged_reason)
        "steps": len(recorder.rows), "final_train_reward": sum(tail) / len(tail) if tail else float("nan"),
        "first_train_reward": rewards[0] if rewards else float("nan"),
        "wall_time_s": round(time.time() - t_start + ckpt.elapsed_before, 2),  # all attempts
        "mean_step_time_s": sum(r["step_time_s"] for r in recorder.rows) / max(1, len(recorder.rows)),
        **counts, **ckpt.summary(), **data_facts,
        "precision": precision, "trainable_dtypes": trainable_dtypes(trainer.model),
        "adapter": policy.fingerprint,  # what was actually built: peft type/config, counts, init checksum
        "flags": flagmod.detect(recorder.rows),  # collapse flag -> first step it fired (lorarl.train.flags)
    }
    if collapse.stopped_at is not None:
        summary["stopped_on_collapse"] = collapse.stopped_at
    tracker.log_summary({k: summary[k] for k in ("final_train_reward", "wall_time_s", "params_trainable",
                                                  "trainable_fraction")},
                        tags={**policy.mlflow_tags(), "lorarl.state": divergence.state,
                              **flagmod.mlflow_tags(summary["flags"])})
    tracker.finish()
    _write_json(work / "cell.json", {"id": cell.id, "axes": cell.axes, "hash": cell.hash, "eval_hash": cell.eval_hash,
                                      "aliases": list(cell.aliases), "config": cfg.model_dump(mode="json")})
    disk_full_hook(work / "summary.json")  # test hook LORARL_FAULT=disk_full (lorarl.io; handled in lorarl.pipeline.diskfull)
    _write_json(work / "summary.json", summary)
    for name in ("cell.json", "metrics.csv", "adapter", "summary.json"):  # summary.json last: the "done" mark
        dst = final / name
        if dst.is_dir():
            shutil.rmtree(dst)
        os.replace(work / name, dst)
    shutil.rmtree(work, ignore_errors=True)
    ckpt.finish()  # outputs in place: delete the checkpoints (train.keep_checkpoint keeps the last)
    if until is not None:  # ended before its rung (lorarl.train.until): the rung job's output, last
        untilmod.write_mark(results_dir, study, cell, until, ended=True, state=divergence.state, mlflow_run_id=run_id)
    ranks.barrier()
    return summary
