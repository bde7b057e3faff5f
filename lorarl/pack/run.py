"""The pack job: train K cells in one process and stage every member's normal outputs.

    train_pack("demo", [cell_a, cell_b], results_dir="results", pack_id="pack-1a2b3c4d5e")

Per member, the run a solo cell has, by the same object (:class:`lorarl.train.cellrun.CellRun`): its own MLflow
run (the cell's params and ``axis.*`` tags, plus ``lorarl.pack``), metrics.csv (the source of truth), snapshots
(``eval.eval_every``), checkpoints in ``results/<study>/.checkpoints/<cell>/`` under the cell's own lock (engine
"pack": lorarl.train.cellstate), divergence (NaN: that cell stops, the others go on) and collapse stops, then
``adapter/``, ``cell.json``, ``metrics.csv`` and ``summary.json``. This module hosts the runs: it builds the
pack, steps it, and hands each member's row and state writer to its run.
Outputs are STAGED in ``<cell dir>/.packed/`` (Snakemake removes a job's declared outputs before
it runs, so the pack never writes another job's outputs); the cell's own ``train`` job moves them into
place (:mod:`lorarl.pack.publish`). The pack's record is ``results/<study>/.packs/<pack_id>.json``.

Members already finished, already staged, held by another trainer (their lock is taken) or holding a solo
(``hf``) checkpoint (their own ``train`` job resumes it) are left out, and their hand-over released at once
(lorarl.pack.handover), so their own ``train`` jobs do not wait for the pack's end.
Resume: each member restores its own checkpoint (adapter, AdamW moments, schedule, data order, sampling
generator, step, monitors), saved in any pack position or alone; members at different steps catch up in the
same loop (a member takes part in a step only while it is below its ``train.steps``), so a resumed pack stays
bit-for-bit a pack of fresh ones. Preemption (Slurm's USR2 / SIGTERM): every member still running checkpoints at
the end of its step, the members that left are staged as usual, then one requeue for the pack (lorarl.train.preemption).
``stop_at``: every member ends paused at that step (lorarl.train.cellrun), to
come back later in any pack or alone (:func:`train_alone`: a pack of one in the cell's own ``train`` job).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorarl import paths
from lorarl.io import write_json as _write_json
from lorarl.jobclock import first_work
from lorarl.pack import handover, publish

OUTCOME = ("state", "mlflow_run_id", "paused_at_step", "stopped_on_collapse")  # a member's outcome in the record


@dataclass(eq=False)
class Member:
    """One member of a pack: its cell, its run (lorarl.train.cellrun.CellRun, which owns all its bookkeeping) and,
    once the pack is built, its place in it: the trainer's cell (model, optimizer, schedule, state), the loop's
    member (step, data order, sampling generator, monitors) and its adapted policy (its save)."""

    cell: Any  # the study's cell
    run: Any  # its CellRun (the door: open, step_done, end_step, close)
    trained: Any = None  # lorarl.pack.trainer.PackCell: model, optimizer, scheduler, state, diverged_at
    stream: Any = None  # lorarl.pack.steps' member: step, data order, sampler, adv_std_peak, tokens_seen
    policy: Any = None  # lorarl.adapters.AdaptedPolicy: save, fingerprint, MLflow tags
    left_at: float | None = None  # when its last step in this job ended (its wall_time_s ends there)

    def write_state(self, folder: Path) -> None:
        """The member's engine state (lorarl.train.cellstate, engine "pack") into a checkpoint folder."""
        from lorarl.train import cellstate

        c, m = self.trained, self.stream
        cellstate.save_engine(folder, c.model, c.optimizer, c.scheduler,
                              {"data_order": m.order.state_dict(), "sampler": m.sampler.get_state()}, m.step)

    def load_state(self, resume: Any) -> None:
        """The member's checkpoint (``resume``: lorarl.train.cellrun.Resume; saved in any pack position, or alone)
        into its pack position."""
        from lorarl.train import cellstate

        c, m = self.trained, self.stream
        streams, m.step = cellstate.load_engine(Path(resume.path), c.model, c.optimizer, c.scheduler)
        m.order.load_state_dict(streams["data_order"])
        m.sampler.set_state(streams["sampler"])
        m.adv_std_peak = float(resume.monitors.get("adv_std_peak", 0.0))
        m.tokens_seen = float(resume.monitors.get("tokens_seen", 0.0))
        c.diverged_at = resume.diverged_at
        c.state = resume.state if resume.state in ("diverged", "stopped") else "running"

    def monitors(self) -> dict:
        """Its monitors for its checkpoints (the running peak of adv/std, the tokens seen)."""
        return {"adv_std_peak": float(self.stream.adv_std_peak), "tokens_seen": float(self.stream.tokens_seen)}


def _checkpoint(member: Member, force: bool, pause: bool = False) -> bool:
    """Per-step checkpoint bookkeeping of one member; True when the pack must stop (preemption)."""
    from lorarl import ledger

    with ledger.phase("checkpoint"):  # the member's checkpoint write, when due (lorarl.ledger)
        return member.run.end_step(member.stream.step, member.write_state, pause=pause, force=force)


def claim_members(study: str, cells: list[Any], results_dir: str | Path, pack_id: str, t_start: float,
                  stop_at: int | None) -> tuple[list[Member], dict]:
    from lorarl.train import cellstate
    from lorarl.train.cellrun import CellRun, WrongHost

    members, left_out = [], {}
    for c in cells:
        if not publish.unfinished(results_dir, study, c.id, c.hash):
            left_out[c.id] = "finished (or staged) already"
            continue
        if cellstate.waiting_engine(results_dir, study, c) == "hf":
            left_out[c.id] = "holds a solo (TRL) checkpoint: its own train job resumes it"
            continue
        try:
            run = CellRun(study, c, results_dir, c.config, engine="pack", stage=handover.stage, lock_wait_s=0,
                          holder=f"pack {pack_id}", stop_at=stop_at, t_start=t_start)
        except WrongHost:  # a solo (TRL) checkpoint written since the check above
            left_out[c.id] = "holds a solo (TRL) checkpoint: its own train job resumes it"
            continue
        except RuntimeError:
            left_out[c.id] = "being trained by another job"
            continue
        if run.done is not None:  # finished by another job since the check above: its lock is released
            left_out[c.id] = "finished (or staged) already"
            continue
        members.append(Member(c, run))
    for cid, why in left_out.items():  # its own train job need not wait for the pack's end (lorarl.pack.handover)
        handover.HandOver.of(results_dir, study, cid).release(pack_id, f"left out of its pack: {why}")
    return members, left_out


def train_pack(study: str, cells: list[Any], results_dir: str | Path = "results", threads: int | None = None,
               pack_id: str = "pack", stop_at: int | None = None, update_cells: int | None = None) -> dict:
    """Train the members of one pack; stage each member's outputs; write the pack's record. On several ranks
    (a pack job of W tasks) each rank trains its share of the members (lorarl.pack.ranks) and rank 0 writes
    the record. ``stop_at``: every member ends paused at that training step (full state saved, nothing staged).
    ``update_cells``: cells per backward pass (``pack.update_cells``, the job's ``--update-cells``; None: all)."""
    from lorarl.pack import ranks

    rank, world = ranks.world()
    meet = ranks.Rendezvous(pack_id, rank, world) if world > 1 else None
    if meet is not None:
        ranks.one_process()  # each rank's pack (and its vLLM engine) is a one-process job
    try:
        out = _train_members(study, ranks.place(cells, rank, world), results_dir, threads, pack_id,
                             {"id": pack_id, "members": [c.id for c in cells], **({"rank": rank} if meet else {})},
                             stop_at, update_cells)
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
               "outcomes": {k: v for r in reports for k, v in r["outcomes"].items()},
               "wall_time_s": max(r["wall_time_s"] for r in reports),
               "ranks": [r["trained"] for r in reports]}
    out = {"pack": pack_id, "study": study, **out}
    record = paths.cell_dir(results_dir, study, paths.PACKS) / f"{pack_id}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    _write_json(record, out)
    return out


def train_alone(study: str, cell: Any, results_dir: str | Path = "results", threads: int | None = None, *,
                stop_at: int | None = None) -> dict:
    """The cell's own ``train`` job when its state is the pack engine's (lorarl.train.cellstate.waiting_engine):
    a pack of one resumes it and publishes its outputs in place, equal to its uninterrupted run. Its summary."""
    from lorarl.pack import ranks
    from lorarl.train.cellrun import CellRun

    rank, world = ranks.world()
    if rank > 0:  # a one-cell pack runs on one process; the job's other ranks have nothing to do
        return {"cell": cell.id, "rank": rank}
    if world > 1:
        ranks.one_process()  # rank 0 alone: a one-process job (its vLLM engine too)
    t_start = time.time()
    run = CellRun(study, cell, results_dir, cell.config, engine="pack", stop_at=stop_at, t_start=t_start)
    if run.done is not None:
        return run.done
    return train_members(study, [Member(cell, run)], results_dir, threads, None, t_start)[cell.id]


def _train_members(study: str, cells: list[Any], results_dir: str | Path, threads: int | None, pack_id: str,
                   info: dict, stop_at: int | None = None, update_cells: int | None = None) -> dict:
    """Train these members as one pack in this process (their outputs staged); the rank's outcome."""
    t_start = time.time()
    members, left_out = claim_members(study, cells, results_dir, pack_id, t_start, stop_at)
    summaries = (train_members(study, members, results_dir, threads, info, t_start, left_out, update_cells=update_cells)
                 if members else {})
    return {"trained": sorted(c for c, s in summaries.items() if s.get("state") != "paused"),
            "left_out": left_out, "states": {c: s["state"] for c, s in summaries.items()},
            "outcomes": {c: {k: s[k] for k in OUTCOME if k in s} for c, s in summaries.items()},
            "wall_time_s": round(time.time() - t_start, 2)}


def train_members(study: str, members: list[Member], results_dir: str | Path, threads: int | None,
                  info: dict | None, t_start: float, left_out: dict | None = None, boundary: Any = None,
                  door: Any = None, update_cells: int | None = None) -> dict[str, dict]:
    """Build the pack of these members' cells, resume each from its own state, step until every member finished
    (or paused, or stopped), and end each member's run. Returns {cell id: its summary}. ``boundary()`` (a resident
    pack's): asked after a step in which a member left; True = every member still running pauses at this step.
    ``door`` (a resident job's, lorarl.pack.build.Door): the base, reference, data and regimes its packs share.
    ``update_cells``: cells per backward pass (the pack job's ``--update-cells``; None: all at once)."""
    import torch

    from lorarl.memory.auto import job_cell  # `auto` knobs + teacher/PRM devices for this job
    from lorarl.pack.build import build_pack
    from lorarl.train.preemption import catch

    if threads:
        torch.set_num_threads(threads)
    summaries: dict[str, dict] = {}
    try:
        device = "cpu" if not torch.cuda.is_available() else "cuda"
        pack = build_pack([job_cell(p.cell, results_dir=str(results_dir)) for p in members], results_dir=results_dir,
                          device=device, update_cells=update_cells or None, door=door)
        loop = pack.loop
        for p, trained, stream, policy in zip(members, loop.trainer.cells, loop.members, pack.policies, strict=True):
            p.trained, p.stream, p.policy = trained, stream, policy
        for p in members:
            resume = p.run.open(pack.precision, save=p.policy.save, tokenizer=pack.tokenizer,
                                tags={"lorarl.pack": info["id"]} if info else None)
            p.run.host_state = p.monitors
            if resume.path is not None:
                p.load_state(resume)
            if p.trained.state == "running" and resume.state == "paused":
                p.trained.state = "paused"  # resumed at its stop step already: it takes no step
        where = f" rank {info['rank']}" if info and "rank" in info else ""
        print(f"[lorarl] {'pack ' + info['id'] if info else 'one-cell pack'}{where}: training "
              f"{', '.join(p.cell.id for p in members)}" + (f" (left out: {left_out})" if left_out else ""), flush=True)
        for p in members:  # the grading workers ready before the first step: the job's start-up, not the step's
            p.run.ready()
        # USR2 / SIGTERM reach every member at once: each still running checkpoints at the end of its step (whoever
        # came first, whether it still trains); the others end as they would have; then ONE requeue
        # (lorarl.train.preemption)
        with catch([p.run.checkpoints for p in members]) as caught:
            stop = False
            while not stop:
                first_work("training step")  # the job's start-up ends here (lorarl.jobclock)
                rows = loop.step()
                if not rows:
                    break
                stepped = [p for p in members if p.cell.id in rows]
                for p in stepped:
                    p.trained.state = p.run.step_done(p.stream.step, rows[p.cell.id], p.trained.model,
                                                      update_refused=p.trained.state == "diverged")
                active = {id(members[k]) for k in loop.active()}  # per member: its own state and step
                going = [p for p in stepped if p.trained.state == "running" and id(p) in active]
                pause = (boundary is not None and len(going) < len(stepped) and bool(going) and not caught.requested
                         and boundary())  # preempted: the members still running stop for the requeue instead
                for p in stepped:
                    paused_here = pause and p in going  # a place freed and a cell waits: the members still
                    if paused_here:  # running pause here (lorarl.pack.resident re-forms the pack)
                        p.trained.state = "paused"
                    stop = _checkpoint(p, force=p.trained.state != "running", pause=paused_here) or stop
                    if p.trained.state != "running" or id(p) not in active:
                        p.left_at = p.left_at if p.left_at is not None else time.time()
        for p in members:  # a member stopped for a preemption stays open: its checkpoint holds it for the requeue
            if not p.run.preempted:
                summaries[p.cell.id] = p.run.close(p.policy, p.trained.model, facts=pack.data_facts,
                                                   extra={"pack": info} if info else None, ended_at=p.left_at)
        caught.hand_over(waiting=boundary is not None and boundary())  # ONE requeue (or exit) for the whole pack
    except BaseException as err:
        for p in members:
            if p.cell.id not in summaries:  # a closed member's run is ended already
                p.run.fail(err)
        raise
    return summaries
