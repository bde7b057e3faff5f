"""The submitit seam: every base/train/evaluate/diagnose/toy job goes through here, locally or on Slurm.

`lorarl launch <stage> <study.yaml> <cell>` (what the Snakemake rules call) submits a `StageJob` with
submitit, waits, and on failure prints the job's state and the tail of its stderr, then exits
non-zero so Snakemake marks the cell failed. Executors:
- `debug`: in-process (pdb-able; no isolation),
- `local`: a child process per job (the default profile),
- `slurm`: a Slurm job; partition/account/qos/time/resources come from the profile
  (`config: slurm: {train: {...}, evaluate: {...}, base: {...}}`), never from studies.

`StageJob` is submitit-`Checkpointable`: on Slurm's pre-timeout or preemption signal (USR2) it is
requeued, and the train stage resumes from its latest checkpoint into the same MLflow run
(`lorarl.train.checkpoint`). Every submission and every (re)start of the job is appended to the stage's
provenance file (`lorarl.provenance`): git SHA + diff, pip freeze, host, GPU, all Slurm job ids.

Logs: `results/<study>/<cell>/logs/<stage>/<jobid>_0_log.{out,err}` (requeued attempts append to the
same files), next to the Snakemake log of the stage (`logs/<stage>.log`).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import submitit

from lorarl.pipeline.jobs import inflight, oom, train_layout
from lorarl.pipeline.jobs.executor import make_executor
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.pipeline.jobs.stages import Job, get_stage, log_key, stage_module
from lorarl.pipeline.jobs.slurm import (ACTIVE, coerce, controller_state, requeued, sacct_info, slurm_parameters,
                                   squeue_state)
from lorarl import jobids, lazy_imports, ledger, paths, provenance
from lorarl.io import tail_text

POLL_ENV = "LORARL_POLL_S"  # how often (s) the launcher asks Slurm about a job at least


def run_stage(stage: str, study_path: str, cell_id: str, results_dir: str, threads: int | None = None,
              params: JobParams = JobParams()) -> dict:
    """What a job executes (``params``: its command line's job parameters, lorarl.pipeline.jobs.jobparams); out of
    disk space becomes one clear error (lorarl.pipeline.jobs.diskfull)."""
    lazy_imports.defer_optional_imports()  # transformers' scikit-learn import, to its first use (lorarl.lazy_imports)
    try:
        return _run_stage(stage, study_path, cell_id, results_dir, threads, params)
    except Exception as err:
        from lorarl.pipeline.jobs.diskfull import disk_full_error, free_partial_outputs, is_disk_full

        if is_disk_full(err):
            free_partial_outputs(stage, study_path, cell_id, results_dir)
            raise disk_full_error(err, stage, cell_id, results_dir) from err
        raise


def _run_stage(stage: str, study_path: str, cell_id: str, results_dir: str, threads: int | None,
               params: JobParams) -> dict:
    """What a job executes: the registered stage (lorarl.pipeline.jobs.stages) imports its heavy stack itself."""
    spec = get_stage(stage)  # unknown names fail before anything runs
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    job = oom.job_for_attempt(stage, Job(study_path, cell_id, results_dir, threads, params))  # out-of-memory retries
    out = spec.run(job)
    oom.annotate(stage, job)
    return out


class StageJob(submitit.helpers.Checkpointable):
    """One stage of one cell, as submitted. Requeued as is on preemption/timeout: the train stage
    resumes from its checkpoints on disk, evaluate and base simply run again. Its job parameters (``params``)
    are pickled with it, so a requeued job keeps them."""

    def __init__(self, stage: str, study_path: str, cell_id: str, results_dir: str, threads: int | None,
                 provenance_file: str | None = None, submission: int | None = None, study_name: str | None = None,
                 params: JobParams = JobParams()):
        self.stage, self.study_path, self.cell_id = stage, study_path, cell_id
        self.results_dir, self.threads, self.params = results_dir, threads, params
        self.provenance_file, self.submission = provenance_file, submission
        self.study_name, self.launcher_pid = study_name, os.getpid()  # the cost record's (the job's pid: `debug`)
        # the profile's MLflow store (lorarl launch --tracking), a user setting: travels with the job, any executor
        self.env = {k: os.environ[k] for k in ("LORARL_TRACKING", "LORARL_TRACKING_CREDENTIALS") if k in os.environ}
        self.stage_module = stage_module(stage)  # imported by the job: its stage's registration (the doctor's)

    def __call__(self) -> dict:
        os.environ.update(getattr(self, "env", {}))
        spec = self.spec()
        if spec.trains and train_layout.export_ranks() > 1:
            if spec.members:
                from lorarl.pack.ranks import pin_gpu

                pin_gpu()  # a pack rank trains its members alone on its GPU
            if int(os.environ["RANK"]) > 0:
                return run_stage(self.stage, self.study_path, self.cell_id, self.results_dir, self.threads,
                                 getattr(self, "params", JobParams()))
        if self.provenance_file:
            os.environ[jobids.ENV_PATH] = self.provenance_file
            provenance.safely(provenance.record_attempt_start, self.provenance_file, self.submission)
        try:
            with self._cost():
                out = run_stage(self.stage, self.study_path, self.cell_id, self.results_dir, self.threads,
                                getattr(self, "params", JobParams()))
        except BaseException as err:
            outcome = ("interrupted (requeue, preemption or cancel)" if isinstance(err, SystemExit)
                       else f"failed: {type(err).__name__}: {err}")
            if self.provenance_file:
                provenance.safely(provenance.record_attempt_end, self.provenance_file, self.submission, outcome)
            raise
        if self.provenance_file:
            provenance.safely(provenance.record_attempt_end, self.provenance_file, self.submission, "completed")
        return out

    def spec(self) -> Any:  # its stage's registry entry in any process: the module that registered it, imported
        importlib.import_module(getattr(self, "stage_module", __name__))
        return get_stage(self.stage)

    def _cost(self) -> Any:
        """This attempt's cost record beside its provenance (lorarl.ledger); `debug` runs it in the launcher's process."""
        from lorarl.jobclock import process_age_s

        prov = self.provenance_file
        spec = self.spec()  # the doctor's stage too (its module imported): the ledger's phase is its entry's fact
        key = Path(prov or self.stage).stem if spec.for_study else self.stage  # base: provenance.json
        return ledger.job(ledger.cost_dir(prov) if prov else None, self.stage,
                          in_process=os.getpid() == getattr(self, "launcher_pid", None), process_age_s=process_age_s(),
                          key=key, study=getattr(self, "study_name", None), cell=self.cell_id, threads=self.threads,
                          until=getattr(self, "params", JobParams()).until, work=spec.work)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # The state that matters lives on disk (lorarl.train.checkpoint): resubmit the same job.
        return submitit.helpers.DelayedSubmission(self)


def final_state(job: submitit.Job, executor: str, wait_s: float = 60) -> dict[str, str]:
    """The job's state from the scheduler, not submitit's cache; waits for a terminal Slurm state."""
    if executor != "slurm":
        try:
            return {"State": job.get_info(mode="force").get("State", "UNKNOWN")}
        except Exception:  # noqa: BLE001
            return {"State": "UNKNOWN"}
    deadline = time.time() + wait_s
    info: dict[str, str] = {}
    while True:
        info = sacct_info(job.job_id)
        if not info:  # sacct cannot say (slurmdbd down?): slurmctld, else submitit's (maybe stale) state
            ctl = controller_state(job.job_id)
            if ctl == "GONE":
                return {"State": "UNKNOWN", "Reason": "no sacct record; slurmctld no longer knows the job"}
            info = ({"State": ctl, "Reason": "from slurmctld (no sacct record)"} if ctl else
                    {"State": job.get_info(mode="force").get("State", "UNKNOWN")})
        state = info.get("State", "UNKNOWN").split()[0]  # "CANCELLED by 0" -> CANCELLED
        if state not in ACTIVE and state != "UNKNOWN" or time.time() > deadline:
            return info
        time.sleep(2)


def error_summary(err: BaseException) -> str:
    """One line: the job's exception (`OSError: ...`) from submitit's traceback, or its own message."""
    lines = [line.strip() for line in str(err).splitlines()]
    if "----------------------" in lines:  # FailedJobError: the job's traceback between two rulers
        i = lines.index("----------------------")
        j = lines.index("----------------------", i + 1) if "----------------------" in lines[i + 1:] else len(lines)
        body = [line for line in lines[i + 1:j] if line]
        if body:
            return body[-1][:1000]
    text = " ".join(line for line in lines[:3] if line)
    return f"{type(err).__name__}: {text}"[:1000]


def _clear_stale_results(folder: Path) -> None:
    """Job ids restart on a fresh cluster: an old `<id>_result.pkl` would be read as this job's result."""
    for p in list(folder.glob("*_result.pkl")) + list(folder.glob("*_submitted.pkl")):
        p.unlink(missing_ok=True)


def launch(stage: str, study_path: str, cell_id: str, results_dir: str = "results",
           executor: str = "local", threads: int = 1, slurm: dict[str, Any] | None = None,
           params: JobParams = JobParams()) -> int:
    """Submit one stage of one cell with its job parameters (``params``: `lorarl launch`'s --attempt, --until,
    --places, ...), wait for it, report failure with the log tail. Returns exit code."""
    results_dir = str(Path(results_dir).resolve())  # the job may start in another directory
    spec, key = get_stage(stage), log_key(stage, params)
    config_hash = None
    if not spec.for_study:
        study_name = None
        folder = Path(results_dir) / "models" / ".logs" / cell_id
    else:
        from lorarl.language.study import cell_table, load_study

        study_path = str(Path(study_path).resolve())
        study = load_study(study_path)
        study_name = study.name
        if spec.members:
            return _launch_pack(study_path, study, cell_id, results_dir, executor, threads, slurm, params)
        config_hash = None if spec.log_cell else cell_table(study).cell(cell_id).hash
        if spec.cell_layout:
            from lorarl.pipeline.jobs.rung_jobs import handed_over

            if handed_over(results_dir, study.name, cell_id, config_hash, params.until):  # a pack trained it (to the end, or a rung)
                return 0
        folder = paths.cell_dir(results_dir, study.name, spec.log_cell or cell_id) / "logs" / key
    folder.mkdir(parents=True, exist_ok=True)
    if executor == "slurm":  # the job's CPU threads are what Slurm grants, not the local Snakemake count
        slurm = coerce(slurm or {})
        threads = int(slurm.get("cpus_per_task", threads or 1))
    threads = max(1, int(threads or 1))
    larger = None
    if spec.cell_layout:  # the profile's layout for this cell (per-study/per-model overrides), ranks made explicit
        cfg = cell_table(study).cell(cell_id).config
        big = train_layout.oom_resources(slurm, study.name, cfg.model, cfg)  # layouts.on_oom: the last OOM retry's
        if big is not None and params.attempt >= oom.MAX_ATTEMPTS:
            larger = f"{train_layout.ranks(big, cfg)} ranks ({big.get('nodes', 1)} node(s))"
        slurm = train_layout.job_resources(big if larger else train_layout.train_resources(slurm, study.name, cfg.model),
                                           cfg, executor)
    name = f"lorarl-{key}-{study_name or 'models'}-{cell_id}"
    prov = provenance.provenance_path(results_dir, study_name, spec.log_cell or cell_id, stage)
    if key != stage:
        prov = prov.with_name(f"{key}.json")
    t0 = time.time()
    if (refused := oom.before_attempt(folder, key, cell_id, params.attempt, larger)) is not None:  # not an OOM's retry
        return refused
    if _adopted(executor, folder, name, prov, key, stage, results_dir, study_name, cell_id, config_hash, params):
        return 0
    _clear_stale_results(folder)
    index = provenance.record_submission(prov, stage=stage, study=study_name, cell=cell_id,
                                         config_hash=config_hash, executor=executor, slurm=slurm,
                                         invocation=params.invocation)
    ex = make_executor(executor, folder, threads, slurm, name=name)
    job = ex.submit(StageJob(stage, study_path, cell_id, results_dir, threads, str(prov), index, study_name, params))
    provenance.record_job_id(prov, index, job.job_id, name)
    print(f"[lorarl] {key} {cell_id}: submitted job {job.job_id} ({executor}), logs in {folder}", flush=True)
    return _finish(job, executor, key, stage, results_dir, study_name, cell_id, config_hash, prov, t0, params)


def _launch_pack(study_path: str, study: Any, members: str, results_dir: str, executor: str, threads: int,
                 slurm: dict[str, Any] | None, params: JobParams) -> int:
    """`lorarl launch pack <study> <c1,c2,...> --pack-id=<id>`: claim the members (lorarl.pack.handover), submit ONE
    job that trains them all (lorarl.pack.run), wait, release those not staged. The job's layout: its members' training
    layout, at most one rank per member (lorarl.pack.ranks). Record: results/<study>/.packs/<pack id>.json."""
    from lorarl.pack import handover
    from lorarl.language.study import cell_table

    ids = members.split(",")
    table = cell_table(study)
    for c in ids:
        table.cell(c)  # unknown ids fail here, before anything is written
    pid = params.require_pack_id()  # the plan's id, from the rule (workflow/rules/pack.smk): never computed here
    claimed = handover.claim_members(results_dir, study.name, ids, pid)  # in this launcher's name
    try:
        folder = paths.cell_dir(results_dir, study.name, paths.pack_folder(pid)) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        if executor == "slurm":
            slurm = coerce(slurm or {})
            threads = int(slurm.get("cpus_per_task", threads or 1))
        threads = max(1, int(threads or 1))
        slurm, larger = train_layout.pack_layout(slurm, study.name, [table.cell(c).config for c in ids], executor,
                                                 params.attempt >= oom.MAX_ATTEMPTS)
        prov = provenance.provenance_path(results_dir, study.name, paths.pack_folder(pid), "pack")
        name = f"lorarl-pack-{study.name}-{pid}"
        if (refused := oom.before_attempt(folder, "pack", pid, params.attempt, larger)) is not None:
            return refused
        if _adopted(executor, folder, name, prov, "pack", "pack", results_dir, study.name, pid, None, params):
            return 0
        _clear_stale_results(folder)
        index = provenance.record_submission(prov, stage="pack", study=study.name, cell=members, config_hash=None,
                                             executor=executor, slurm=slurm, invocation=params.invocation)
        ex = make_executor(executor, folder, threads, slurm, name=name)
        job = ex.submit(StageJob("pack", study_path, members, results_dir, threads, str(prov), index, study.name,
                                 params))
        provenance.record_job_id(prov, index, job.job_id, name)
        print(f"[lorarl] pack {pid} ({members}): submitted job {job.job_id} ({executor}), logs in {folder}", flush=True)
        return _finish(job, executor, "pack", "pack", results_dir, study.name, pid, None, prov, time.time(), params,
                       ids)
    finally:
        handover.release_members(claimed, pid, "its pack's launcher ended")


def _finish(job: submitit.Job, executor: str, key: str, stage: str, results_dir: str, study_name: str | None,
            cell_id: str, config_hash: str | None, prov: Path, t0: float, params: JobParams,
            members: list[str] | None = None) -> int:
    """Wait for our own job; success = the job succeeded AND its outputs are there. A train or pack job that
    failed leaves no cell's MLflow run RUNNING (lorarl.tracking.dead_runs)."""

    def on_signal(signum: int, frame: Any) -> None:  # Snakemake interrupted: don't leave an orphan job
        print(f"[lorarl] {signal.Signals(signum).name}: cancelling job {job.job_id}", file=sys.stderr, flush=True)
        job.cancel(check=False)
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        error = _wait(job, executor, key, cell_id)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    missing = inflight.missing_outputs(stage, results_dir, study_name, cell_id, config_hash, params)
    if error is None and not missing:
        print(f"[lorarl] {key} {cell_id}: done in {time.time() - t0:.1f}s (job {job.job_id})", flush=True)
        return 0
    if error is None:  # the scheduler said success (or could not say): the outputs decide
        error = RuntimeError(f"job {job.job_id} ended as a success but its outputs are missing: {', '.join(missing)}")
    info = final_state(job, executor)
    state = info.get("State", "UNKNOWN")
    detail = ", ".join(f"{k.lower()} {info[k]}" for k in ("ExitCode", "Reason", "Elapsed", "NodeList")
                       if info.get(k) not in (None, "", "None"))
    ids = ",".join(jobids.job_ids(prov)) or job.job_id
    failed = "\n".join([  # the failure report; a refused retry repeats it (Snakemake rewrites the stage log)
        f"[lorarl] error: {error_summary(error)}",
        f"[lorarl] {key} {cell_id} FAILED: job {job.job_id} state {state}" + (f" ({detail})" if detail else ""),
        f"[lorarl] tail of {job.paths.stderr}:\n{tail_text(job.paths.stderr)}",
        f"[lorarl] {key} {cell_id} FAILED: job {job.job_id} state {state}; all job ids of this stage: {ids}; "
        f"stderr {job.paths.stderr}"])
    print(failed, file=sys.stderr, flush=True)
    if get_stage(stage).trains:
        from lorarl.tracking.dead_runs import after_job

        after_job(results_dir, study_name, members or [cell_id], f"job {job.job_id} ended {state} (its launcher)")
    return oom.after_failure(Path(job.paths.folder), error_summary(error), params.attempt, failed)  # OOM_EXIT: retried


def _wait(job: submitit.Job, executor: str, key: str, cell_id: str) -> BaseException | None:
    """Wait for the job (through requeues), printing its state changes; the error, or None on success.

    A finished job is seen within a second when it wrote its result (success or exception). One that
    died without one (cancelled, out of memory, timeout, node failure) is seen by asking Slurm:
    submitit asks sacct ever less often (up to every 10 min); this asks at least every
    $LORARL_POLL_S seconds (default 60: one sacct call per minute per running cell)."""
    poll_s = float(os.environ.get(POLL_ENV, "60"))
    last, forced, ended = None, time.monotonic(), None
    while True:
        try:
            if executor == "slurm" and time.monotonic() - forced > poll_s:
                job.get_info(mode="force")  # refreshes submitit's cached state
                forced = time.monotonic()
                if not job.paths.result_pickle.exists() and not sacct_info(job.job_id):
                    # sacct cannot say (slurmdbd down: submitit keeps a stale or UNKNOWN state): slurmctld
                    ctl = controller_state(job.job_id)
                    if ctl is not None and ctl.split()[0] not in ACTIVE:
                        ended = ctl  # ended without a result: never taken as a success
                        break
            if job.done():
                if not (executor == "slurm" and requeued(job, f"{key} {cell_id}")):
                    break
        except Exception as err:  # noqa: BLE001 - a flaky sacct call must not fail the cell
            print(f"[lorarl] polling job {job.job_id}: {err}", file=sys.stderr)
        if executor == "slurm":
            state = job.state
            if state != last:
                print(f"[lorarl] {key} {cell_id}: job {job.job_id} {state}", flush=True)
                last = state
            if state.startswith("PREEMPTED") and squeue_state(job.job_id) is None:
                break  # preempted without requeue: submitit would wait forever
        time.sleep(1.0)
    if ended is not None and not job.paths.result_pickle.exists():
        return RuntimeError(f"job {job.job_id} ended without a result: sacct has no state (unavailable?), "
                            f"slurmctld says {ended}")
    try:
        job.results()  # every task's (a training job of several ranks: one per rank)
    except Exception as err:  # noqa: BLE001 - FailedJobError, UncompletedJobError, ...
        return err
    return None


def _adopted(executor: str, folder: Path, name: str, prov: Path, key: str, stage: str, results_dir: str,
             study_name: str | None, cell_id: str, config_hash: str | None, params: JobParams) -> bool:
    """A lost launcher's job of this stage still in flight is waited on instead of submitting a duplicate:
    True = it finished with its outputs. False = none, or it ended without them (failed, or they were
    written before this Snakemake started and removed by its cleanup of incomplete outputs): submit again
    (training resumes from its checkpoint if it can)."""
    found = inflight.find_job(executor, folder, name, prov)
    if found is None:
        return False
    print(f"[lorarl] {key} {cell_id}: job {found[0]} of an earlier launcher is still {found[1]}: waiting on it "
          f"instead of submitting a duplicate", flush=True)
    if _finish_adopted(found[0], executor, folder, key, stage, results_dir, study_name, cell_id, config_hash,
                       params) == 0:
        return True
    print(f"[lorarl] {key} {cell_id}: submitting it again", flush=True)
    return False


def _finish_adopted(job_id: str, executor: str, folder: Path, key: str, stage: str, results_dir: str,
                    study_name: str | None, cell_id: str, config_hash: str | None, params: JobParams) -> int:
    """Wait on a job submitted by an earlier (lost) launcher; its outputs decide the result."""
    if executor == "slurm":
        job = submitit.SlurmJob(folder, job_id)
        _wait(job, executor, key, cell_id)
        info = final_state(job, executor)
    else:
        inflight.wait_local(job_id)
        info = {"State": "EXITED"}
    missing = inflight.missing_outputs(stage, results_dir, study_name, cell_id, config_hash, params)
    if not missing:
        print(f"[lorarl] {key} {cell_id}: adopted job {job_id} finished; outputs in place", flush=True)
        return 0
    print(f"[lorarl] adopted job {job_id} ended ({info.get('State', 'UNKNOWN')}) without its outputs: "
          f"{', '.join(missing)}", file=sys.stderr, flush=True)
    return 1
