"""Out-of-memory retries (lorarl.memory.ladder, lorarl.pipeline.jobs.oom): the ladder table, OOM recognition, the
launcher's retry decisions, a cell run one rung down with its science (signatures) unchanged. The end-to-end
run through Snakemake's retries is tests/pipeline/test_oom_snakemake.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from lorarl.memory.ladder import (LadderExhausted, TrainRung, eval_ladder, planned_train, rung, train_config,
                                  train_ladder)
from lorarl.pipeline.jobs import launch, oom
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.pipeline.jobs.stages import Job
from lorarl.language.signature import signature_dump
from tests.support.study import seeds, tiny_study

R = TrainRung
STUDY = tiny_study("om",
                   task={"name": "synthetic", "n_train": 16,
                         "n_eval": 4},
                   train={"steps": 1, "prompts_per_step": 4, "generations": 2,
                          "max_completion_length": 8},
                   eval={"batch_size": 8}, axes=seeds(0))


@pytest.mark.parametrize("planned,want", [
    (R(8, 16, False), [R(8, 16, False), R(4, 8, False), R(4, 8, True)]),  # halve, then checkpointing
    (R(8, 16, True), [R(8, 16, True), R(4, 8, True), R(2, 4, True)]),  # checkpoints already: halve again
    (R(5, None, False), [R(5, None, False), R(3, None, False), R(3, None, True)]),  # vllm: no generation chunk
    (R(1, 1, False), [R(1, 1, False), R(1, 1, True)]),  # nothing to halve: straight to checkpointing
    (R(1, 1, True), [R(1, 1, True)]),  # nothing left: the next rung is a larger layout
    (R(2, 1, True), [R(2, 1, True), R(1, 1, True)]),
])
def test_train_ladder(planned, want):
    assert train_ladder(planned) == want
    assert rung(want, 1) == planned  # attempt 1: as planned
    with pytest.raises(LadderExhausted, match="no larger layout allowed by the profile"):
        rung(want, len(want) + 1)


@pytest.mark.parametrize("size,backend,want", [(64, "hf", [64, 32, 16]), (3, "hf", [3, 2, 1]), (2, "hf", [2, 1]),
                                               (1, "hf", [1]), (64, "vllm", [64])])
def test_eval_ladder(size, backend, want):
    assert eval_ladder(size, backend) == want


def test_rung_refuses_a_bad_attempt():
    with pytest.raises(ValueError, match="attempt must be a whole number >= 1"):
        rung([R(1, 1, True)], 0)


def test_planned_train_reads_a_resolved_config(tmp_path: Path):
    from lorarl.language.study import load_study, study_cells

    (tmp_path / "s.yaml").write_text(yaml.safe_dump(STUDY))
    cfg = study_cells(load_study(tmp_path / "s.yaml"))[0].config
    assert planned_train(cfg, "cpu") == R(8, 8, False)  # null = the whole update / rollout; auto = off on a CPU
    assert planned_train(cfg, "cuda") == R(8, 8, True)
    small = train_config(cfg, R(4, 2, True))
    assert (small.train.micro_batch_size, small.rollout.generation_batch_size,
            small.train.gradient_checkpointing) == (4, 2, "on")
    assert signature_dump(small) == signature_dump(cfg)  # runtime fields only: the science is unchanged
    auto = cfg.model_copy(update={"train": cfg.train.model_copy(update={"micro_batch_size": "auto"})})
    with pytest.raises(ValueError, match="train.micro_batch_size is still auto"):
        planned_train(auto, "cpu")


def test_is_oom():
    assert oom.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert oom.is_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = torch.OutOfMemoryError("x")
    assert oom.is_oom(wrapped)
    assert not oom.is_oom(ValueError("train.lr must be positive"))
    assert not oom.is_oom("OSError: [Errno 28] No space left on device")


def test_only_an_out_of_memory_failure_is_retried(tmp_path: Path, capsys):
    assert oom.before_attempt(tmp_path, "train", "c", 1) is None
    assert oom.after_failure(tmp_path, "ValueError: bad data", 1) == 1  # not out of memory
    assert oom.before_attempt(tmp_path, "train", "c", 2) == 1  # Snakemake's retry is refused at once
    err = capsys.readouterr().err
    assert "[lorarl] error: ValueError: bad data" in err and "only out-of-memory failures are retried" in err

    assert oom.before_attempt(tmp_path, "train", "c", 1) is None  # a new Snakemake run starts afresh
    assert not (tmp_path / oom.RECORD).exists()
    assert oom.after_failure(tmp_path, "torch.OutOfMemoryError: CUDA out of memory", 1) == oom.OOM_EXIT
    for n in (2, 3):
        assert oom.before_attempt(tmp_path, "train", "c", n) is None
        assert f"attempt {n} after out of memory in attempt {n - 1}" in capsys.readouterr().out
        assert oom.after_failure(tmp_path, "torch.OutOfMemoryError: CUDA out of memory", n) == oom.OOM_EXIT
    assert oom.before_attempt(tmp_path, "train", "c", 4) == 1
    assert "no larger layout allowed by the profile" in capsys.readouterr().err
    assert oom.before_attempt(tmp_path, "train", "c", 4, larger="2 ranks (1 node(s))") is None  # the profile's on_oom
    assert "retrying on the larger layout the profile allows: 2 ranks (1 node(s))" in capsys.readouterr().out
    assert oom.after_failure(tmp_path, "torch.OutOfMemoryError: CUDA out of memory", 4) == oom.OOM_EXIT
    # past the ladder: refused whatever the profile allows
    assert oom.before_attempt(tmp_path, "train", "c", 5, larger="2 ranks (1 node(s))") == 1
    assert "the larger layout ran out of memory too" in capsys.readouterr().err
    with pytest.raises(ValueError, match="job parameter attempt='x': allowed: a whole number >= 1"):
        JobParams(attempt="x")
    with pytest.raises(ValueError, match="job parameter attempt=0: allowed"):
        JobParams(attempt=0)


def test_a_retried_cell_runs_one_rung_down_with_its_hashes_unchanged(tmp_path: Path, monkeypatch, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    plain = Job(str(study), "s0", str(tmp_path), 1).cell()
    job = oom.job_for_attempt("train", Job(str(study), "s0", str(tmp_path), 1, JobParams(attempt=3)))
    cell = job.cell()
    assert (cell.config.train.micro_batch_size, cell.config.rollout.generation_batch_size,
            cell.config.train.gradient_checkpointing) == (4, 4, "on")
    assert (cell.id, cell.hash, cell.eval_hash) == (plain.id, plain.hash, plain.eval_hash)
    assert "out-of-memory retry, attempt 3: s0: micro_batch_size 8 -> 4" in capsys.readouterr().out
    ev = oom.job_for_attempt("evaluate", Job(str(study), "s0", str(tmp_path), 1, JobParams(attempt=3)))
    assert ev.cell().config.eval.batch_size == 2 and ev.cell().hash == plain.hash
    assert not ev.table.is_base("s0")  # the rest of the table is the study's

    (tmp_path / "om" / "s0").mkdir(parents=True)
    (tmp_path / "om" / "s0" / "summary.json").write_text(json.dumps({"state": "done"}))
    oom.annotate("train", job)
    got = json.loads((tmp_path / "om" / "s0" / "summary.json").read_text())
    assert got == {"state": "done", "oom_retries": [
        {"attempt": 2, "micro_batch_size": 4, "generation_batch_size": 4, "gradient_checkpointing": False},
        {"attempt": 3, "micro_batch_size": 4, "generation_batch_size": 4, "gradient_checkpointing": True}]}


def test_the_fault_hook_raises_cuda_out_of_memory_above_its_threshold(tmp_path: Path, monkeypatch):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    monkeypatch.setenv("LORARL_FAULT", "oom_above:4")
    for n, fails in ((1, True), (2, False)):  # 8 sequences > 4; then 4
        job = oom.job_for_attempt("train", Job(str(study), "s0", str(tmp_path), 1, JobParams(attempt=n)))
        if fails:
            with pytest.raises(torch.OutOfMemoryError, match="LORARL_FAULT=oom_above:4"):
                job.cell()
        else:
            assert job.cell().config.train.micro_batch_size == 4
    monkeypatch.setenv("LORARL_FAULT", "oom_above:x")
    with pytest.raises(ValueError, match="oom_above:N needs a whole number"):
        oom.fault_threshold()
    monkeypatch.setenv("LORARL_FAULT", "oom_ranks_below:2")  # a job of fewer ranks runs out of memory
    with pytest.raises(torch.OutOfMemoryError, match="1 rank\\(s\\) < 2"):
        oom.job_for_attempt("train", Job(str(study), "s0", str(tmp_path), 1)).cell()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert oom.job_for_attempt("train", Job(str(study), "s0", str(tmp_path), 1)).cell().id == "s0"
    monkeypatch.setenv("LORARL_FAULT", "oom_ranks_below:y")
    with pytest.raises(ValueError, match="oom_ranks_below:N needs a whole number"):
        oom.fault_ranks()


class _Job:
    """A submitted job that ends with ``error`` (no scheduler, no process)."""

    def __init__(self, folder: Path, error: BaseException | None):
        self.job_id, self.error = "7", error
        self.paths = SimpleNamespace(folder=folder, stderr=folder / "7_0_log.err")


def _fake_submit(monkeypatch, error: BaseException | None, submitted: list) -> None:
    class Executor:
        def __init__(self, kind, folder, *a, **k):
            self.folder = Path(folder)

        def submit(self, fn):
            submitted.append(fn)
            return _Job(self.folder, error)

    monkeypatch.setattr(launch, "make_executor", Executor)
    monkeypatch.setattr(launch, "_wait", lambda job, *a: job.error)
    monkeypatch.setattr(launch, "final_state", lambda job, executor: {"State": "FAILED"})


def test_the_launcher_exits_with_the_oom_status_and_refuses_a_non_oom_retry(tmp_path: Path, monkeypatch, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    submitted: list = []
    _fake_submit(monkeypatch, RuntimeError("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB"),
                 submitted)
    assert launch.launch("train", str(study), "s0", str(tmp_path), executor="local",
                         params=JobParams(attempt=1)) == oom.OOM_EXIT
    assert submitted[-1].params.attempt == 1  # the attempt travels with the job, as an argument
    _fake_submit(monkeypatch, RuntimeError("ValueError: bad input"), submitted)
    assert launch.launch("train", str(study), "s0", str(tmp_path), executor="local",
                         params=JobParams(attempt=2)) == 1  # ran: not an OOM
    assert len(submitted) == 2 and submitted[-1].params.attempt == 2
    assert launch.launch("train", str(study), "s0", str(tmp_path), executor="local", params=JobParams(attempt=3)) == 1
    assert len(submitted) == 2  # attempt 2 was no OOM: attempt 3 is not submitted
    err = capsys.readouterr().err
    assert err.rstrip().endswith("attempt 3 not run: attempt 2 did not run out of memory; only out-of-memory "
                                 "failures are retried")
    assert "[lorarl] error: RuntimeError: ValueError: bad input" == err.splitlines()[-2]


def test_the_rules_retry_as_often_as_the_ladder_has_attempts():
    import re

    common = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / "common.smk").read_text()
    assert int(re.search(r"^OOM_RETRIES = (\d+)$", common, re.M).group(1)) == oom.MAX_ATTEMPTS - 1
    for rules in ("train.smk", "evaluate.smk", "pack.smk"):
        text = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / rules).read_text()
        assert text.count("retries: OOM_RETRIES") == text.count("oom_attempt=oom_attempt") >= 1
