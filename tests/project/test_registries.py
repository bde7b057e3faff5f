"""Every extension point is a registry that the code consults by name, never by an if-ladder: stages
(lorarl.pipeline.jobs.stages), study kinds (lorarl.language.kinds) and reward regimes (lorarl.rewards.registry).
Adding one is adding one entry; unknown names are refused with the allowed values."""

from __future__ import annotations

import sys
import types

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from lorarl.language import kinds
from lorarl.cli import main
from lorarl.rewards.registry import reward_section
from lorarl.pipeline.doctor import stage as doctor_stage  # the doctor registers its own stage
from lorarl.pipeline.jobs import stages
from lorarl.pipeline.jobs.launch import StageJob, run_stage
from lorarl.rewards import REGIMES, Deposits, RegimeSpec
from lorarl.rewards.registry import build_regime, regime_names
from lorarl.language.study import StudyError, cell_table, parse_study


def test_stages_are_registered_and_unknown_ones_name_the_allowed():
    assert {"base", "train", "evaluate", "diagnose", "toy", "pack"} <= set(stages.launchable())
    assert "doctor" in stages.STAGES and "doctor" not in stages.launchable()
    with pytest.raises(ValueError, match="unknown stage 'trian'; allowed: base, train"):
        run_stage("trian", "-", "x", "results")


def test_a_job_imports_the_module_that_registered_its_stage(monkeypatch: pytest.MonkeyPatch):
    """The doctor registers its stage in its own module (the launcher never imports it); the job records that
    module and imports it, as a fresh job process does, before asking the registry."""
    assert stages.stage_module("doctor") == doctor_stage.__name__ == "lorarl.pipeline.doctor.stage"
    assert stages.stage_module("train") == stages.__name__
    job = StageJob("doctor", "smoke.yaml", "c1", "results", 1)
    monkeypatch.delitem(stages.STAGES, "doctor")  # a fresh process: nothing has imported the doctor yet
    monkeypatch.delitem(sys.modules, doctor_stage.__name__)
    with pytest.raises(ValueError, match="unknown stage 'doctor'"):
        stages.get_stage("doctor")
    assert job.spec().name == "doctor" and not job.spec().launchable


def test_a_registered_stage_runs_through_the_launcher_and_cli(monkeypatch, tmp_path, capsys):
    seen = []

    def echo(job: stages.Job) -> dict:
        seen.append((job.study_path, job.target, job.results_dir, job.threads))
        return {"echo": job.target}

    monkeypatch.setitem(stages.STAGES, "echo", stages.Stage("echo", echo, "test stage"))
    assert run_stage("echo", "s.yaml", "c1", str(tmp_path), 3) == {"echo": "c1"}
    assert seen == [("s.yaml", "c1", str(tmp_path), 3)]
    monkeypatch.chdir(tmp_path)  # `lorarl run` loads the study first (a missing model: exit 2 before running)
    (tmp_path / "s.yaml").write_text("name: s\ndefaults: {model: local:tiny-arith, task: {name: synthetic}}\n")
    assert main(["run", "s.yaml", "c2", "--stages", "echo", "--results", str(tmp_path)]) == 0
    assert seen[-1][1] == "c2" and '"echo": "c2"' in capsys.readouterr().out
    assert main(["run", "s.yaml", "c2", "--stages", "echo,nope", "--results", str(tmp_path)]) == 2
    assert "--stages nope: not a stage `lorarl run` runs; allowed:" in capsys.readouterr().err and len(seen) == 2
    with pytest.raises(ValueError, match="registered twice"):
        stages.register_stage("echo", "again")(echo)


def test_lorarl_run_refuses_the_doctors_stage_naming_the_allowed_ones(monkeypatch, tmp_path, capsys):
    """The doctor's stage is no cell stage (`lorarl doctor` runs its own jobs): `lorarl run --stages doctor` exits 2
    before anything runs, naming the stages it runs, also in a process that imported the doctor (it used to run it)."""
    from lorarl.pipeline.jobs import launch

    ran = []
    monkeypatch.setattr(launch, "run_stage", lambda *a, **kw: ran.append(a) or {})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("name: s\ndefaults: {model: local:tiny-arith, task: {name: synthetic}}\n")
    assert doctor_stage.NAME in stages.STAGES  # imported (this module's import): registered
    assert main(["run", "s.yaml", "c1", "--stages", "train,doctor", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: --stages doctor: not a stage `lorarl run` runs; allowed: {', '.join(stages.launchable())}" in err
    assert "base, train, evaluate" in err and "doctor" not in err.split("allowed:")[1] and not ran


def test_a_stage_entry_carries_what_the_launcher_asks(monkeypatch, tmp_path):
    """Outputs, log key, OOM retry, resources key, scratch folder: facts of the entry, read by the launcher's parts."""
    from lorarl.pipeline.jobs import diskfull, inflight, oom
    from lorarl.pipeline.jobs.jobparams import JobParams

    assert stages.resources_keys() == ["base", "train", "evaluate", "diagnose", "toy"]  # the profile's slurm: sections
    assert stages.log_key("evaluate", JobParams(eval_target="gsm8k@2")) == "evaluate-gsm8k@2"
    assert stages.log_key("train", JobParams(eval_target="gsm8k")) == "train"
    echo = stages.Stage("echo", lambda job: {}, "test stage", outputs=lambda r, s, c, p: [tmp_path / f"{c}.done"],
                        key_param="until", resources_key="gpu", scratch=".echo.tmp")
    monkeypatch.setitem(stages.STAGES, "echo", echo)
    assert inflight.missing_outputs("echo", str(tmp_path), "s", "c1") == [str(tmp_path / "c1.done")]
    (tmp_path / "c1.done").write_text("{}")
    assert inflight.missing_outputs("echo", str(tmp_path), "s", "c1", config_hash="h") == []  # no hashed output
    assert stages.log_key("echo", JobParams(until=4)) == "echo-4" and "gpu" in stages.resources_keys()
    job = stages.Job("s.yaml", "c1", str(tmp_path), 1, JobParams(attempt=2))
    assert oom.job_for_attempt("echo", job)._table is None  # no oom_retry: the cells run as configured
    (tmp_path / "s.yaml").write_text("name: s\ndefaults: {model: local:tiny-arith, task: {name: synthetic}}\n")
    (tmp_path / "s" / "c1" / ".echo.tmp").mkdir(parents=True)
    diskfull.free_partial_outputs("echo", str(tmp_path / "s.yaml"), "c1", str(tmp_path))
    assert not (tmp_path / "s" / "c1" / ".echo.tmp").exists() and (tmp_path / "s" / "c1").is_dir()


def test_unknown_study_kind_names_the_allowed():
    with pytest.raises(StudyError, match="unknown study kind 'ppo'; allowed: grpo, kl_bound_toy"):
        parse_study({"name": "s", "kind": "ppo"})


class _TinyCell(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = 1  # the only setting of the test kind's cells


def test_a_registered_kind_builds_its_cells_and_aggregates(monkeypatch, tmp_path):
    aggregated = []
    mod = types.ModuleType("lorarl_test_kind_mod")
    mod.aggregate = lambda study, results: aggregated.append((study.name, results))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    kind = kinds.Kind("tiny", lambda: _TinyCell, batch_stage="toy", aggregate=f"{mod.__name__}:aggregate")
    monkeypatch.setitem(kinds.KINDS, "tiny", kind)
    raw = {"name": "t", "kind": "tiny", "axes": {"w": {"field": "width", "values": [1, 2, 3]}}}
    table = cell_table(parse_study(raw))
    assert [c.config.width for c in table.cells] == [1, 2, 3] and table.base_ids == []
    study_file = tmp_path / "t.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    assert main(["aggregate", str(study_file), "--results", str(tmp_path)]) == 0
    assert aggregated == [("t", str(tmp_path))]
    assert main(["report", str(study_file), "--results", str(tmp_path)]) == 2  # kind has no report


def test_register_kind_needs_exactly_one_way_to_run():
    with pytest.raises(ValueError, match="exactly one"):
        kinds.register_kind(kinds.Kind("x", lambda: _TinyCell))
    with pytest.raises(ValueError, match="registered twice"):
        kinds.register_kind(kinds.KINDS["grpo"])


def test_regimes_register_themselves_and_config_follows_the_registry(monkeypatch):
    assert set(regime_names()) == {"outcome", "process", "distillation"}
    with pytest.raises(ValueError, match="unknown reward.regime 'dense'; allowed: distillation, outcome, process"):
        reward_section({"regime": "dense"})

    class Constant:
        name, needs_student_logps, needs_gold, reports_accuracy = "constant", False, False, False

        def deposits(self, rollouts):
            return Deposits([[len(ids) - 1] for ids in rollouts.completion_ids], [[0.5]] * len(rollouts))

    monkeypatch.setitem(REGIMES, "constant", RegimeSpec("constant", lambda cfg, tok, **kw: Constant()))
    cfg = reward_section({"regime": "constant"})  # the config accepts what the registry holds (the common section)
    assert build_regime(cfg, None).name == "constant"
