"""Faults around the launcher (lorarl.pipeline.jobs.inflight) and the fault-injection run (lorarl.pipeline.drills.faults).

Fast: the outputs decide a stage's success (a job reported successful without its outputs fails the
cell); a lost launcher's local job is found by its log folder. Slow: a real training job whose
launcher is SIGKILLed is adopted by the next launcher (no duplicate job, no lock failure); and the
small fault-injection run (one SIGKILL of each stage: train, evaluate, diagnose and aggregate
processes, a launcher and the whole submit host; `snakemake all` again after each invocation with a kill)
completes with every metric row exactly once, adapters equal to the uninterrupted run and no partial
output. `python -m lorarl.pipeline.drills.faults --kills 20` prints the full figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lorarl import jobids, provenance
from lorarl.pipeline.jobs import inflight, launch, slurm
from tests.support.study import TRAIN, seeds, tiny_study

STUDY = tiny_study("fl", eval=None, train={**TRAIN, "steps": 4, "checkpoint_every": 2}, axes=seeds(0))


def test_missing_outputs_of_each_stage(tmp_path: Path):
    from lorarl.pipeline.jobs.jobparams import JobParams

    res = str(tmp_path)
    cell = tmp_path / "st" / "c"
    assert len(inflight.missing_outputs("train", res, "st", "c", "h1")) == 4
    cell.mkdir(parents=True)
    for f in ("metrics.csv", "cell.json"):
        (cell / f).write_text("x")
    (cell / "adapter").mkdir()
    (cell / "summary.json").write_text(json.dumps({"config_hash": "h0"}))
    assert "expected h1" in inflight.missing_outputs("train", res, "st", "c", "h1")[0]  # another config's
    assert inflight.missing_outputs("train", res, "st", "c", "h0") == []
    assert [Path(p).name for p in inflight.missing_outputs("evaluate", res, "st", "c", None,
                                                           JobParams(eval_target="synthetic@2"))] == \
        ["synthetic@2.json", "synthetic@2.jsonl"]
    assert inflight.missing_outputs("evaluate", res, "st", "c") == []  # all targets: not one file to check
    assert [Path(p).name for p in inflight.missing_outputs("diagnose", res, "st", "c")] == ["diagnostics.parquet"]


def test_a_job_that_succeeds_without_its_outputs_fails_the_cell(tmp_path: Path, monkeypatch, capsys):
    """Snakemake's own Slurm executor counts an UNKNOWN job as done; here the outputs decide."""
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    monkeypatch.setattr(launch, "run_stage", lambda *a, **k: {"ok": True})  # "succeeds", writes nothing
    assert launch.launch("diagnose", str(study), "s0", str(tmp_path), executor="debug") == 1
    err = capsys.readouterr().err
    assert "ended as a success but its outputs are missing" in err and "diagnostics.parquet" in err


def test_a_lost_launchers_local_job_is_found_by_its_folder(tmp_path: Path):
    folder = (tmp_path / "logs" / "train").resolve()
    folder.mkdir(parents=True)
    # a stand-in with the command line of a submitit local controller for this folder
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "submitit.local._local",
                             str(folder)])
    try:
        time.sleep(0.5)
        assert inflight.local_job_in_flight(folder) == str(proc.pid)
        assert inflight.local_job_in_flight(tmp_path / "logs" / "evaluate") is None
        assert inflight.find_job("local", folder, "n", tmp_path / "none.json") == (str(proc.pid), "RUNNING")
        assert inflight.find_job("debug", folder, "n", tmp_path / "none.json") is None
    finally:
        proc.kill()
        proc.wait()
    assert not inflight.pid_alive(str(proc.pid)) and inflight.local_job_in_flight(folder) is None


def test_a_zombie_is_not_alive_for_status_claims_or_adoption():
    """An exited, unreaped process (what a SIGKILLed daemon stays while init reaps late) is dead to
    every liveness check: status, pack hand-overs and in-flight adoption all use `io.pid_alive`."""
    from lorarl import io

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[-1][:1] != "Z" and time.time() < deadline:
        time.sleep(0.05)
    try:
        assert Path(f"/proc/{proc.pid}").exists()  # still there, a zombie: kill -0 succeeds on it
        assert not io.pid_alive(proc.pid) and not inflight.pid_alive(str(proc.pid))
        assert io.pid_alive(os.getpid()) and not io.pid_alive("not-a-pid")
    finally:
        proc.wait()
    assert not io.pid_alive(proc.pid)


# ---- slow ---------------------------------------------------------------------------------------------

def _orphan_then_relaunch(cmd: list[str], prov: Path) -> tuple[str, subprocess.CompletedProcess]:
    """Start a launcher, SIGKILL it once its job id is recorded (the job runs on, orphaned), launch again."""
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not jobids.job_ids(prov) and time.time() < deadline:
        time.sleep(0.2)
    job = jobids.job_ids(prov)[0]
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert inflight.pid_alive(job)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert len(provenance.read(prov)["submissions"]) == 1  # no duplicate submitted
    return job, second


@pytest.mark.slow
def test_a_killed_launchers_job_is_adopted_not_duplicated(tmp_path: Path, tiny_test_base: Path):
    from tests.support.trained import place_base

    place_base(tiny_test_base, tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    cmd = [sys.executable, "-m", "lorarl.cli", "launch", "train", str(study), "s0", "--results", str(tmp_path),
           "--executor", "local"]
    folder = tmp_path / "fl" / "s0" / "logs" / "train"
    job, second = _orphan_then_relaunch(cmd, tmp_path / "fl" / "s0" / "provenance" / "train.json")
    assert f"job {job} of an earlier launcher is still RUNNING" in second.stdout
    assert json.loads((tmp_path / "fl" / "s0" / "summary.json").read_text())["steps"] == 4
    logs = "".join(p.read_text() for p in folder.glob("*.err"))
    assert "being trained by another process" not in logs


@pytest.mark.slow
def test_a_killed_launchers_pack_job_is_adopted_not_duplicated(tmp_path: Path, tiny_test_base: Path):
    """The same for a pack job (issue 14): the orphaned pack job is waited on, not submitted twice, and
    its members' train launchers publish what it trained."""
    from lorarl.pack.plan import pack_id
    from tests.support.trained import place_base

    place_base(tiny_test_base, tmp_path)
    study = tmp_path / "study.yaml"
    spec = json.loads(json.dumps(STUDY))
    spec["axes"]["seed"]["values"] = [0, 1]
    spec["defaults"]["train"]["steps"] = 6
    study.write_text(yaml.safe_dump(spec))
    pid = pack_id(["s0", "s1"])
    cmd = [sys.executable, "-m", "lorarl.cli", "launch", "pack", str(study), "s0,s1", "--results", str(tmp_path),
           "--executor", "local", f"--pack-id={pid}"]
    job, second = _orphan_then_relaunch(cmd, tmp_path / "fl" / ".packs" / pid / "provenance" / "pack.json")
    assert f"pack {pid}: job {job} of an earlier launcher is still RUNNING" in second.stdout
    record = json.loads((tmp_path / "fl" / ".packs" / f"{pid}.json").read_text())
    assert record["trained"] == ["s0", "s1"] and not record["left_out"], record
    for c in ("s0", "s1"):
        train = subprocess.run([sys.executable, "-m", "lorarl.cli", "launch", "train", str(study), c, "--results",
                                str(tmp_path), "--executor", "local"], capture_output=True, text=True, timeout=600)
        assert train.returncode == 0 and "trained in its pack" in train.stdout, train.stdout[-2000:] + train.stderr
        assert json.loads((tmp_path / "fl" / c / "summary.json").read_text())["pack"]["id"] == pid


@pytest.mark.slow
def test_fault_injection_small_run(tmp_path: Path):
    """One SIGKILL of each stage (train, evaluate, diagnose, aggregate, a launcher, the submit host) in
    a 1-cell study, several kills per `snakemake all`; the study completes every time, as the reference."""
    from lorarl.pipeline.drills import faults

    out = tmp_path / "figures.json"
    rc = faults.main(["--kills", "1", "--per-pass", "1", "--cells", "1", "--workdir", str(tmp_path / "runs"),
                      "--json", str(out)])
    fig = json.loads(out.read_text())
    assert rc == 0, fig
    assert fig["completed"] == fig["passes"] >= 1
    assert fig["kills"] == {s: 1 for s in faults.STAGES}, fig["kills"]
    assert fig["lost"] == 0 and fig["duplicated"] == 0 and fig["extra_runs"] == 0 and not fig["bad_outputs"]
    assert fig["adapters_within_tol"] == fig["cells"] == fig["passes"]  # 1 cell per completed run
    assert fig["eval_equal"] == fig["cells"]


@pytest.mark.slow
def test_a_killed_snakemake_all_recovers_with_the_documented_commands(tmp_path: Path):
    """`snakemake all --config studies=[tk]`'s whole process group SIGKILLed once its job wrote a first output
    (lock and "incomplete" marks left on outputs that exist), config/config.yaml naming another study (the
    demo, as in a fresh clone): the documented recovery, `snakemake --unlock` then `snakemake all`, each with the
    killed study's `--config studies=...` (default profile only), completes tk and runs nothing of the demo;
    without rerun-incomplete there it stops with IncompleteFilesException."""
    from lorarl.pipeline.drills import faults, recovery

    spec = {"name": "tk", "kind": "kl_bound_toy", "defaults": {"toy": {"epochs": 2, "lr": 1.0e-3}},  # seconds
            "axes": {"rank": {"field": "rank", "prefix": "r", "values": [1, 2, 4, 8]},
                     "seed": {"field": "seed", "prefix": "s", "values": [0, 1, 2]}}}
    study = str(tmp_path / "study.yaml")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(spec))
    root = recovery.workspace(tmp_path, {})  # config/config.yaml as in the repository: the demo
    assert recovery.COMMANDS["local"] == (faults.UNLOCK, faults.RUN)
    assert [recovery.shown(c) for c in (faults.UNLOCK, faults.RUN)] == [  # as the pages give them
        """snakemake --unlock --config studies='["experiments/<study>.yaml"]'""",
        """snakemake all --config studies='["experiments/<study>.yaml"]'"""]
    log, marks = tmp_path / "snakemake.log", tmp_path / ".snakemake" / "incomplete"
    with open(log, "a") as fh:
        proc = subprocess.Popen(recovery.argv(faults.RUN, study), cwd=root, env=faults._env(), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while not any(tmp_path.glob("results/tk/*/summary.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any(marks.iterdir()) and any((tmp_path / ".snakemake" / "locks").iterdir()), log.read_text()
    assert recovery.recover(root, faults._env(), log, study) == 0, log.read_text()[-3000:]
    assert "IncompleteFilesException" not in log.read_text()
    cells = sorted(json.loads(p.read_text())["cell"] for p in tmp_path.glob("results/tk/*/summary.json"))
    assert cells == sorted(f"r{r}-s{s}" for r in (1, 2, 4, 8) for s in (0, 1, 2))
    assert not (tmp_path / "results" / "demo").exists() and not (tmp_path / "results" / "models").exists()


def test_fault_driver_plans(tmp_path: Path):
    """Kill shares across workers, the kill drawn for a new process, and bad arguments (exit 2)."""
    from lorarl.pipeline.drills import faults

    shares = faults._shares(20, ("train", "host"), 3)
    assert [b["train"] for b in shares] == [7, 7, 6] and sum(b["host"] for b in shares) == 20
    assert faults._shares(1, ("train",), 4) == [{"train": 1}, {"train": 0}, {"train": 0}, {"train": 0}]
    import random

    rng = random.Random(0)
    assert faults._pick("train", {"train": 0, "host": 3}, rng) is None
    assert faults._pick("launcher", {"launcher": 0, "host": 2}, rng) == "host"
    picks = [faults._pick("launcher", {"launcher": 1, "host": 1}, rng) for _ in range(200)]
    assert 50 < picks.count("host") < 150 and set(picks) == {"launcher", "host"}
    for bad in (["--cells", "0"], ["--stages", "train,nope"], ["--workers", "0"], ["--kills", "0"]):
        assert faults.main(bad + ["--workdir", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()  # nothing written


def test_fault_driver_finds_only_its_own_processes(tmp_path: Path):
    """A process in `run-1` is not one of `run-10`'s (and vice versa): exact folder matches only."""
    from lorarl.pipeline.drills import faults

    a, b = tmp_path / "pass-1", tmp_path / "pass-10"
    for d in (a, b):
        d.mkdir()
        (d / "lorarl").write_text("import time; time.sleep(60)\n")
    procs = [subprocess.Popen([sys.executable, str(d / "lorarl"), "aggregate", str(d)], cwd=d) for d in (a, b)]
    try:
        deadline = time.time() + 30
        while time.time() < deadline and len(faults._procs(tmp_path)) < 2:
            time.sleep(0.1)
        assert faults._procs(a) == [(procs[0].pid, "aggregate")]
        assert faults._procs(b) == [(procs[1].pid, "aggregate")]
        t0 = faults._started(procs[0].pid, -1.0)
        assert 0 < faults._now() - t0 < 60
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _fake_slurm(tmp_path: Path, monkeypatch, states: list[str]) -> Path:
    """`sacct` that fails (accounting down) and `scontrol show job` answering `states` one call at a time."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Problem talking to the database' >&2\nexit 1\n")
    calls = tmp_path / "calls"
    script = "#!/bin/sh\nn=$(cat {c} 2>/dev/null || echo 0); echo $((n+1)) > {c}\ncase $n in\n".format(c=calls)
    for i, s in enumerate(states):
        script += f"  {i}) echo 'JobId=77 JobName=x JobState={s} Reason=None' ;;\n"
    script += f"  *) echo 'JobId=77 JobName=x JobState={states[-1]} Reason=None' ;;\nesac\n"
    (bin_dir / "scontrol").write_text(script)
    for f in ("sacct", "scontrol"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LORARL_POLL_S", "0")
    return calls


def test_accounting_down_asks_slurmctld(tmp_path: Path, monkeypatch):
    """sacct unavailable: a job that ended without a result fails (slurmctld's state), never hangs; one
    that wrote its result is decided by it (and then by its outputs)."""
    import submitit
    from submitit.core import utils

    calls = _fake_slurm(tmp_path, monkeypatch, ["RUNNING", "RUNNING", "CANCELLED"])
    job = submitit.SlurmJob(tmp_path / "logs", "77")
    err = launch._wait(job, "slurm", "train", "c")
    assert isinstance(err, RuntimeError) and "slurmctld says CANCELLED" in str(err), err
    assert int(calls.read_text()) >= 3  # it kept waiting while slurmctld said RUNNING
    assert launch.final_state(job, "slurm", wait_s=0) == {"State": "CANCELLED",
                                                            "Reason": "from slurmctld (no sacct record)"}

    job2 = submitit.SlurmJob(tmp_path / "logs2", "78")
    job2.paths.result_pickle.parent.mkdir(parents=True)
    utils.cloudpickle_dump(("success", {"ok": True}), job2.paths.result_pickle)
    assert launch._wait(job2, "slurm", "train", "c") is None


def test_accounting_down_and_the_job_forgotten(tmp_path: Path, monkeypatch):
    """sacct down and slurmctld no longer knows the job (MinJobAge passed): UNKNOWN, a failure."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    for f in ("sacct", "scontrol"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LORARL_POLL_S", "0")
    assert slurm.controller_state("79") == "GONE"
    import submitit

    job = submitit.SlurmJob(tmp_path / "logs", "79")
    err = launch._wait(job, "slurm", "train", "c")
    assert isinstance(err, RuntimeError) and "slurmctld says GONE" in str(err)
    assert launch.final_state(job, "slurm", wait_s=0)["State"] == "UNKNOWN"


def test_a_requeued_job_is_waited_on(tmp_path: Path, monkeypatch, capsys):
    """Node failure: sacct says NODE_FAIL (submitit: done, no result) but Slurm requeued the job
    (slurmctld: PENDING): the launcher waits, and the requeued run's result decides."""
    import submitit
    from submitit.core import utils

    job = submitit.SlurmJob(tmp_path / "logs", "77")
    job.paths.result_pickle.parent.mkdir(parents=True)
    utils.cloudpickle_dump(("success", {"ok": True}), tmp_path / "result.pkl")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'JobID|State|NodeList'\necho '77|NODE_FAIL|vm'\n")
    calls = tmp_path / "calls"
    (bin_dir / "scontrol").write_text(
        f"#!/bin/sh\nn=$(cat {calls} 2>/dev/null || echo 0); echo $((n+1)) > {calls}\n"
        f"if [ $n -ge 2 ]; then cp {tmp_path / 'result.pkl'} {job.paths.result_pickle}; "
        "echo 'JobId=77 JobState=COMPLETED'; else echo 'JobId=77 JobState=PENDING Reason=BeginTime'; fi\n")
    for f in ("sacct", "scontrol"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LORARL_POLL_S", "1000")
    assert launch._wait(job, "slurm", "train", "c") is None
    out = capsys.readouterr().out
    assert "job 77 NODE_FAIL, requeued by Slurm (PENDING): waiting on it" in out, out
    assert out.count("requeued by Slurm") == 1 and int(calls.read_text()) >= 2


def test_fault_checks_count_lost_duplicated_and_extra_rows(tmp_path: Path):
    """check() against a reference: a 2-cell run where one cell lost a row, logged one twice and trained
    a step past the last, and has a different adapter and a leftover temporary file."""
    import mlflow
    import torch
    from safetensors.torch import save_file

    from lorarl.pipeline.drills.fault_checks import check

    def make(root: Path, rows: dict[str, list[int]], bump: float = 0.0, tracked: bool = True) -> Path:
        res = root / "results"
        res.mkdir(parents=True)
        client = mlflow.MlflowClient(f"sqlite:///{res}/mlflow.db") if tracked else None
        exp = client.create_experiment("chaos") if tracked else None
        for cell, steps in rows.items():
            d = res / "chaos" / cell
            (d / "adapter").mkdir(parents=True)
            (d / "eval").mkdir()
            (d / "summary.json").write_text("{}")
            (d / "metrics.csv").write_text("step,reward\n" + "".join(f"{s},0.5\n" for s in steps))
            save_file({"w": torch.ones(2) + (bump if cell == "s1" else 0.0)}, str(d / "adapter" / "adapter_model.safetensors"))
            (d / "eval" / "synthetic.json").write_text(json.dumps({"metrics": {"acc": 0.5}}))
            if tracked:
                run = client.create_run(exp, tags={"lorarl.cell_id": cell})
                for s in steps:
                    client.log_metric(run.info.run_id, "reward", 0.5, step=s)
        return res

    ref = make(tmp_path / "ref", {"s0": [1, 2, 3, 4], "s1": [1, 2, 3, 4]}, tracked=False)  # read: files only
    got = check(make(tmp_path / "run", {"s0": [1, 2, 3, 4], "s1": [1, 2, 2, 4, 5]}, bump=1e-3), ref, steps=4)
    assert got["cells"] == 2 and got["extra_runs"] == 0
    assert (got["lost"], got["duplicated"], got["extra"]) == (2, 2, 2)  # step 3 lost, 2 twice, 5 extra (csv + MLflow)
    assert got["adapters_identical"] == 1 and got["adapters_within_tol"] == 1 and got["max_abs_diff"] > 0
    assert got["eval_equal"] == 2 and got["bad_outputs"] == []
    (tmp_path / "run" / "results" / "chaos" / "s0" / "x.json.tmp").write_text("{")
    (tmp_path / "run" / "results" / "chaos" / "s0" / "cut.json").write_text('{"a": ')
    bad = check(tmp_path / "run" / "results", ref, steps=4)["bad_outputs"]
    assert len(bad) == 2 and any("temporary" in b for b in bad) and any("JSONDecodeError" in b for b in bad)

