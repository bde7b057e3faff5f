"""The pack job: train K cells in one process and stage every member's normal outputs.

    train_pack("demo", [cell_a, cell_b], results_dir="results", pack_id="pack-1a2b3c4d5e")

Per member, exactly what :func:`lorarl.train.main.train_cell` gives a solo cell: its own MLflow run (the
cell's params and ``axis.*`` tags, plus ``lorarl.pack``), metrics.csv (the source of truth), snapshots
(``eval.eval_every``), checkpoints in ``results/<study>/.checkpoints/<cell>/`` under the cell's own lock
(:class:`lorarl.train.checkpoint.CellCheckpoints`, format "pack"), divergence (NaN: that cell stops, the others
go on) and collapse stops, then ``adapter/``, ``cell.json``, ``metrics.csv`` and ``summary.json``.
Outputs are STAGED in ``<cell dir>/.packed/`` (Snakemake removes a job's declared outputs before
it runs, so the pack never writes another job's outputs); the cell's own ``train`` job moves them into
place (:mod:`lorarl.pack.publish`). The pack's record is ``results/<study>/.packs/<pack_id>.json``.

Members already finished, already staged, or held by another trainer (their lock is taken) are left out.
Resume: each member restores its own checkpoint (adapter, AdamW moments, schedule, data order, sampling
generator, step); members at different steps catch up in the same loop (a member takes part in a step
only while it is below its ``train.steps``), so a resumed pack stays bit-for-bit a pack of fresh ones.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lorarl import paths
from lorarl.io import write_json as _write_json
from lorarl.pack import publish

STATE_FILE = "pack_state.pt"
UPDATE_CELLS_ENV = "LORARL_PACK_UPDATE_CELLS"  # set by the train_pack rule from the `pack: {update_cells}` setting


@dataclass
class _Slot:
    """One member's bookkeeping in the pack job."""

    cell: Any
    ckpt: Any
    work: Path
    tracker: Any = None
    run_id: str | None = None
    recorder: Any = None
    divergence: Any = None
    snapshots: Any = None
    collapse_at: int | None = None


def _record(recorder: Any, step: int, row: dict) -> None:
    """One step's row into the cell's MetricsRecorder (CSV + MLflow), as its TRL callback would."""
    full = {"step": step, **{k: float(v) for k, v in row.items()}, "step_time_s": float(row.get("time/step_s", 0.0))}
    recorder.rows.append(full)
    recorder._pending.append(full)
    if len(recorder._pending) >= recorder.flush_every and not recorder.log_only_saved:
        recorder.flush()


def _save_state(folder: Path, cell: Any, member: Any) -> None:
    import torch

    tmp = folder / (STATE_FILE + ".tmp")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"adapter": {n: p.detach().cpu() for n, p in cell.model.named_parameters() if p.requires_grad},
                "optimizer": cell.optimizer.state_dict(), "scheduler": cell.scheduler.state_dict(),
                "order": member.order.state_dict(), "sampler": member.sampler.get_state(), "step": member.step,
                "adv_std_peak": member.adv_std_peak, "state": cell.state, "diverged_at": cell.diverged_at}, tmp)
    os.replace(tmp, folder / STATE_FILE)


def _load_state(folder: Path, cell: Any, member: Any) -> None:
    import torch

    st = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    params = dict(cell.model.named_parameters())
    with torch.no_grad():
        for n, v in st["adapter"].items():
            params[n].copy_(v)
    cell.optimizer.load_state_dict(st["optimizer"])
    cell.scheduler.load_state_dict(st["scheduler"])
    member.order.load_state_dict(st["order"])
    member.sampler.set_state(st["sampler"])
    member.step, member.adv_std_peak = int(st["step"]), float(st["adv_std_peak"])
    cell.state, cell.diverged_at = st["state"], st["diverged_at"]


def _checkpoint(slot: _Slot, cell: Any, member: Any, force: bool) -> bool:
    """Per-step checkpoint bookkeeping of one member; True when the pack must stop (preemption)."""
    state = SimpleNamespace(global_step=member.step, max_steps=member.steps)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    slot.ckpt._on_step_end(state, control)
    if force or (slot.ckpt.enabled and control.should_save):  # forced: a member's end, or its rung (kept)
        _save_state(slot.ckpt.root / f"checkpoint-{member.step}", cell, member)
        slot.ckpt._on_save(state)  # lorarl.json (rows, manifest) LAST: the mark of a complete checkpoint
        slot.recorder.flush()  # MLflow sees the steps only once a checkpoint covers them
    return bool(control.should_training_stop)


def _start(slot: _Slot, study: str, results_dir: str | Path, precision: str, pack_id: str) -> None:
    from lorarl.train.callbacks import MetricsRecorder
    from lorarl.train.divergence import Divergence
    from lorarl.tracking.client import Tracker

    cell = slot.cell
    slot.tracker = Tracker(results_dir, study)
    slot.run_id = slot.ckpt.resume_run(slot.tracker) or slot.tracker.start(
        cell.id, run_name=cell.id,
        tags={"lorarl.config_hash": cell.hash, "lorarl.pack": pack_id, **{f"axis.{k}": v for k, v in cell.axes.items()}},
        params={**cell.flat_config(), "train.precision_resolved": precision})
    slot.recorder = MetricsRecorder(slot.work / "metrics.csv", slot.tracker)
    slot.ckpt.restore(slot.recorder, slot.run_id)
    slot.divergence = Divergence()


def _finish(slot: _Slot, study: str, results_dir: str | Path, policy: Any, cell: Any, member: Any, data_facts: dict, precision: str,
            pack_info: dict, t_start: float) -> dict:
    """Save the member's adapter, summary and MLflow summary, stage its outputs, drop its checkpoints."""
    from lorarl.train import flags as flagmod
    from lorarl.train.precision import trainable_dtypes

    c = slot.cell
    rec = slot.recorder
    rec.flush()
    if slot.collapse_at is not None:
        slot.snapshots.fill_after_stop(cell.model)
    policy.save(slot.work / "adapter", cell.model)
    rewards = [r["reward"] for r in rec.rows if "reward" in r and math.isfinite(r["reward"])]
    tail = rewards[-max(1, len(rewards) // 10):]
    summary = {
        "study": study, "cell": c.id, "config_hash": c.hash, "mlflow_run_id": slot.run_id,
        **slot.divergence.summary(),
        "steps": len(rec.rows), "final_train_reward": sum(tail) / len(tail) if tail else float("nan"),
        "first_train_reward": rewards[0] if rewards else float("nan"),
        "wall_time_s": round(time.time() - t_start + slot.ckpt.elapsed_before, 2),  # the pack's wall time
        "mean_step_time_s": sum(r["step_time_s"] for r in rec.rows) / max(1, len(rec.rows)),
        **policy.counts(), **slot.ckpt.summary(), **data_facts,
        "precision": precision, "trainable_dtypes": trainable_dtypes(cell.model), "adapter": policy.fingerprint,
        "flags": flagmod.detect(rec.rows), "pack": pack_info,
    }
    if slot.collapse_at is not None:
        summary["stopped_on_collapse"] = slot.collapse_at
    slot.tracker.log_summary({k: summary[k] for k in ("final_train_reward", "wall_time_s", "params_trainable",
                                                      "trainable_fraction")},
                             tags={**policy.mlflow_tags(), "lorarl.state": slot.divergence.state,
                                   **flagmod.mlflow_tags(summary["flags"])})
    slot.tracker.finish()
    _write_json(slot.work / "cell.json", {"id": c.id, "axes": c.axes, "hash": c.hash, "eval_hash": c.eval_hash,
                                          "aliases": list(c.aliases), "config": c.config.model_dump(mode="json")})
    _write_json(slot.work / "summary.json", summary)
    publish.stage(slot.work, paths.cell_dir(results_dir, study, c.id))
    slot.ckpt.finish()
    return summary


def _claim_members(study: str, cells: list[Any], results_dir: str | Path, pack_id: str) -> tuple[list[_Slot], dict]:
    from lorarl.train.checkpoint import CellCheckpoints

    slots, left_out = [], {}
    for c in cells:
        if not publish.unfinished(results_dir, study, c.id, c.hash):
            left_out[c.id] = "finished (or staged) already"
            continue
        try:
            ckpt = CellCheckpoints(results_dir, study, c, lock_wait_s=0, holder=f"pack {pack_id}", fmt="pack")
        except RuntimeError:
            left_out[c.id] = "being trained by another job"
            continue
        work = paths.cell_dir(results_dir, study, c.id) / ".pack.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        slots.append(_Slot(c, ckpt, work))
    return slots, left_out


def train_pack(study: str, cells: list[Any], results_dir: str | Path = "results", threads: int | None = None,
               pack_id: str = "pack") -> dict:
    """Train the members of one pack; stage each member's outputs; write the pack's record. On several ranks
    (a pack job of W tasks) each rank trains its share of the members (lorarl.pack.ranks) and rank 0 writes
    the record."""
    from lorarl.pack import ranks

    rank, world = ranks.world()
    meet = ranks.Rendezvous(pack_id, rank, world) if world > 1 else None
    if meet is not None:
        ranks.one_process()  # each rank's pack (and its vLLM engine) is a one-process job
    try:
        out = _train_members(study, ranks.place(cells, rank, world), results_dir, threads, pack_id,
                             {"id": pack_id, "members": [c.id for c in cells], **({"rank": rank} if meet else {})})
    except BaseException as err:
        if meet is not None:
            try:
                meet.report({"error": f"{type(err).__name__}: {err}"})
            except Exception:  # noqa: BLE001 - rank 0 gone too: the job fails anyway
                pass
        raise
    if meet is not None:
        meet.report(out)
        if rank > 0:
            return out
        reports = meet.gather()
        out = {"trained": sorted(c for r in reports for c in r["trained"]),
               "left_out": {k: v for r in reports for k, v in r["left_out"].items()},
               "states": {k: v for r in reports for k, v in r["states"].items()},
               "wall_time_s": max(r["wall_time_s"] for r in reports),
               "ranks": [r["trained"] for r in reports]}
    out = {"pack": pack_id, "study": study, **out}
    record = paths.cell_dir(results_dir, study, ".packs") / f"{pack_id}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    _write_json(record, out)
    return out


def _train_members(study: str, cells: list[Any], results_dir: str | Path, threads: int | None, pack_id: str,
                   info: dict) -> dict:
    """Train these members as one pack in this process (their outputs staged); the rank's outcome."""
    import torch

    from lorarl.train import flags as flagmod
    from lorarl.evaluate.plan import snapshot_steps
    from lorarl.train.snapshots import SnapshotSaver
    from lorarl.pack.build import build_pack
    from lorarl.train import until as untilmod  # an adaptive rung: members stop there (no step past it), kept

    until = untilmod.until_step()
    if threads:
        torch.set_num_threads(threads)
    t_start = time.time()
    slots, left_out = _claim_members(study, cells, results_dir, pack_id)
    summaries: dict[str, dict] = {}
    paused: dict[str, str] = {}  # members stopped at their rung (lorarl.train.until)
    try:
        if slots:
            device = "cpu" if not torch.cuda.is_available() else "cuda"
            chunk = int(os.environ.get(UPDATE_CELLS_ENV, "0") or 0) or None  # pack.update_cells (memory knob)
            from lorarl.memory.auto import job_cell  # `auto` knobs + teacher/PRM devices for this job

            pack = build_pack([job_cell(s.cell, results_dir=str(results_dir)) for s in slots], results_dir=results_dir,
                              device=device, update_cells=chunk)
            loop, trainer = pack.loop, pack.loop.trainer
            for k, s in enumerate(slots):
                _start(s, study, results_dir, pack.precision, pack_id)
                if s.ckpt.resumed is not None:
                    _load_state(s.ckpt.resumed.path, trainer.cells[k], loop.members[k])
                s.snapshots = SnapshotSaver(paths.cell_dir(results_dir, study, s.cell.id) / "snapshots",
                                            snapshot_steps(s.cell.config), pack.policies[k].save, pack.tokenizer)
                if until is not None:  # lorarl.train.until: the member trains up to the rung, checkpointed there
                    loop.members[k].steps = min(loop.members[k].steps, until)
            where = f" rank {info['rank']}" if "rank" in info else ""
            print(f"[lorarl] pack {pack_id}{where}: training {', '.join(s.cell.id for s in slots)}"
                  + (f" (left out: {left_out})" if left_out else ""), flush=True)
            with slots[0].ckpt.preemption():  # Slurm's USR2 / SIGTERM: every member checkpoints, then requeue
                stop = False
                while not stop:
                    rows = loop.step()
                    if not rows:
                        break
                    lead = slots[0].ckpt
                    for k, s in enumerate(slots):
                        s.ckpt.preempt_requested = s.ckpt.preempt_requested or lead.preempt_requested
                        s.ckpt.terminate_requested = s.ckpt.terminate_requested or lead.terminate_requested
                        c, m = trainer.cells[k], loop.members[k]
                        if s.cell.id not in rows:
                            continue
                        row = rows[s.cell.id]
                        _record(s.recorder, m.step, row)
                        if c.state == "diverged":
                            s.divergence._mark(m.step, "non-finite loss or gradient (update skipped)")
                        elif s.divergence.check_row(row, m.step):
                            c.state = "diverged"  # a NaN reward/metric: this cell stops, the others go on
                        if c.state == "running" and s.cell.config.train.stop_on_collapse and flagmod.detect(s.recorder.rows):
                            c.state, s.collapse_at = "stopped", m.step
                        if m.step in s.snapshots.steps:
                            s.snapshots.save_step(m.step, c.model)
                        stop = _checkpoint(s, c, m, force=c.state != "running" or m.step == until) or stop
            for k, s in enumerate(slots):
                c = trainer.cells[k]
                if until is not None and c.state == "running":  # at its rung: checkpoint kept, a staged mark
                    untilmod.pause(results_dir, study, s.cell, until, s.run_id, s.ckpt, s.tracker, s.recorder, s.work,
                                   staged=True)
                    paused[s.cell.id] = untilmod.AT_RUNG
                    continue
                if until is not None and c.state == "diverged":  # its rung can still be evaluated
                    s.snapshots.fill_after_stop(c.model)
                summaries[s.cell.id] = _finish(s, study, results_dir, pack.policies[k], c, loop.members[k],
                                               pack.data_facts, pack.precision,
                                               info, t_start)
                if until is not None:
                    untilmod.write_mark(results_dir, study, s.cell, until, staged=True, ended=True, state=c.state,
                                        mlflow_run_id=s.run_id)
    except BaseException as err:
        for s in slots:
            s.ckpt.release()
            if s.tracker is not None:
                s.tracker.finish("KILLED" if isinstance(err, (SystemExit, KeyboardInterrupt)) else "FAILED")
        raise
    return {"trained": sorted(summaries), "left_out": left_out,
            "states": {**{c: s["state"] for c, s in summaries.items()}, **paused},
            "wall_time_s": round(time.time() - t_start, 2)}
