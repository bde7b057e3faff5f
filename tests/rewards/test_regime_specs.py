"""A reward regime's facts live in its registry entry (lorarl.rewards.RegimeSpec) and its class: a regime
registered in one place reaches every planner (local recipes, hub check, memory plan, training ranks, config
validation, report bounds) with no name tested elsewhere (tests/project/test_structure.py). Its `reward:` section is one
of its facts: a study's block is validated by the section its regime names, and every shipped cell keeps its hash."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lorarl.language import hubcheck
from pydantic import ValidationError, model_validator

from lorarl.language.config import CellConfig
from lorarl.language.study import cell_table, load_study, parse_study
from lorarl.memory.plan import shape_of
from lorarl.memory.ranks import has_aux
from lorarl.models import cell_models, study_recipes
from lorarl.report.bounds import outcome_bounds
from lorarl.rewards import REGIMES, ExtraModel, RegimeSpec
from lorarl.rewards.distillation import DistillationDeposits
from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.rewards.process import ProcessDeposits
from lorarl.rewards.registry import extra_models, load_all, reward_section
from lorarl.rewards.section import FLAT_LAYOUT, RewardSection


def _judge(cfg):
    """A new regime's extra model: a judge named by `reward.prm_model`, built from a local recipe if so named."""
    return [ExtraModel("judge", "reward.prm_model", cfg.prm_model, "float32", 3, local_recipe=True)]


class JudgeSection(RewardSection):
    """A new regime's own section: its field and its check."""

    prm_model: str | None = None

    @model_validator(mode="after")
    def _needs_judge(self):
        if not self.prm_model:
            raise ValueError("reward.prm_model is required when reward.regime is 'judge'")
        return self


@pytest.fixture
def judge(monkeypatch):
    monkeypatch.setitem(REGIMES, "judge", RegimeSpec("judge", lambda *a, **kw: None, section=JudgeSection,
                                                     extra_models=_judge, reward_range=lambda cfg: (-1.0, 2.0)))


def test_a_new_regime_reaches_every_planner_through_its_spec(judge):
    cell = CellConfig(model="local:tiny-test", reward={"regime": "judge", "prm_model": "local:tiny-arith"})
    assert cell_models(cell) == ["local:tiny-test", "local:tiny-arith"]
    assert study_recipes([SimpleNamespace(config=cell)]) == ["tiny-test", "tiny-arith"]  # built before the cell
    assert has_aux(cell)  # on one node of 2 GPUs the judge takes the second
    (role, arch, nbytes, batch), = shape_of(cell, "cpu")[0].aux
    assert (role, arch.name, nbytes, batch) == ("judge", "local:tiny-arith", 4, 3)  # its dtype and batch size
    hub = CellConfig(model="local:tiny-test", reward={"regime": "judge", "prm_model": "org/judge-7b"})
    assert [(r.field, r.repo) for r in hubcheck.references(hub) if r.kind == "model"] == [("reward.prm_model", "org/judge-7b")]
    with pytest.raises(ValidationError, match="reward.prm_model is required when reward.regime is 'judge'"):
        CellConfig(reward={"regime": "judge"})
    with pytest.raises(ValidationError, match="reward.terms applies to reward.regime 'outcome'; allowed with regime "
                                              "'judge': regime, grading_timeout_s, answer_format, grading, prm_model"):
        CellConfig(reward={"regime": "judge", "prm_model": "x", "terms": {"correct": 1.0}})
    overlong = CellConfig(reward={"regime": "judge", "prm_model": "x"}, train={"overlong_buffer": 8, "overlong_factor": 0.5})
    assert outcome_bounds(overlong) == (-1.5, 2.0)  # its range, less the overlong shaping


def test_the_built_in_regimes_facts():
    assert [x.role for x in extra_models(reward_section({}))] == []
    assert extra_models(reward_section({"regime": "process"})) == []  # the rule checker loads nothing
    prm, = extra_models(reward_section({"regime": "process", "prm": "hf", "prm_model": "org/prm", "prm_batch_size": 2}))
    assert (prm.role, prm.field, prm.model, prm.dtype, prm.batch_size, prm.local_recipe) == (
        "prm", "reward.prm_model", "org/prm", "auto", 2, False)  # a PRM is loaded by its hub id, never built
    teacher, = extra_models(reward_section({"regime": "distillation", "teacher": "local:tiny-arith", "teacher_dtype": "bfloat16"}))
    assert (teacher.role, teacher.field, teacher.dtype, teacher.local_recipe) == ("teacher", "reward.teacher", "bfloat16", True)
    assert [(c.needs_gold, c.reports_accuracy, c.needs_student_logps)
            for c in (OutcomeDeposits, ProcessDeposits, DistillationDeposits)] == [
        (True, True, False), (False, False, False), (False, False, True)]  # only outcome sees gold and grades
    assert "terms" in REGIMES["outcome"].section.model_fields and "terms" not in REGIMES["process"].section.model_fields
    assert (prm.device_field, teacher.device_field) == ("prm_device", "teacher_device")  # placed on a second GPU


def test_a_reward_block_is_validated_by_its_regimes_section():
    assert type(CellConfig().reward).__name__ == "OutcomeSection"
    cell = CellConfig(reward={"regime": "distillation", "teacher": "org/t"})
    assert type(cell.reward).__name__ == "DistillationSection" and cell.model_dump()["reward"]["teacher"] == "org/t"
    for reward, match in [
        ({"teacher": "org/t"}, "reward.teacher applies to reward.regime 'distillation'; allowed with regime 'outcome': "
                               "regime, grading_timeout_s, answer_format, grading, incorrect_reward, terms"),
        ({"regime": "process", "tacher": "x"}, "reward.tacher is no field of any reward regime; allowed with regime "
                                               "'process': regime, grading_timeout_s, answer_format, grading, step_separator"),
        ({"regime": "dense"}, "unknown reward.regime 'dense'; allowed: distillation, outcome, process"),
        ({"regime": "distillation"}, "reward.teacher is required when reward.regime is 'distillation'"),
        ({"regime": "process", "prm": "hf"}, "reward.prm_model is required when reward.prm is 'hf'"),
        ({"regime": "process", "prm_max_length": 0}, r"reward.prm_max_length\n  Input should be greater than 0"),
    ]:
        with pytest.raises(ValidationError, match=match):
            CellConfig(reward=reward)


# Hashes of shipped cells computed before the reward sections (one flat `reward:` section with every regime's
# fields): a cell of each regime, the teacher row, and a study without a regime axis. Sections must not rehash.
SHIPPED = [("reward_density", "outcome-r16-s0", "1eaa0489c3", "a61bc58f8c"),
           ("reward_density", "process-r16-s0", "c36eda0d61", "a61bc58f8c"),
           ("reward_density", "distillation-r16-s0", "662687dbef", "a61bc58f8c"),
           ("reward_density", "teacher-Qwen3-8B", "a04c8cef9e", "b8dca445d2"),
           ("reward_density_cpu", "outcome-r1-s0", "508fec00b6", "7a5aaec767"),
           ("reward_density_cpu", "process-rfull-s0", "a48e5c3172", "7a5aaec767"),
           ("kl_free_cpu", "r1-kl0", "1b11538d28", "7a5aaec767")]


def test_shipped_cells_keep_their_hashes():
    tables = {s: cell_table(load_study(f"experiments/{s}.yaml")) for s in {row[0] for row in SHIPPED}}
    got = [(s, c, tables[s].cell(c).hash, tables[s].cell(c).eval_hash) for s, c, _, _ in SHIPPED]
    assert got == SHIPPED
    assert len(tables["reward_density"].cells) == 54  # no two cells merged
    defaults = {f: v for spec in load_all().values() for f, v in spec.section.model_construct().model_dump(mode="json").items()}
    assert {f: defaults[f] for f in FLAT_LAYOUT} == FLAT_LAYOUT  # the frozen layout is today's defaults


def test_a_block_shared_by_the_regimes_of_an_axis_gives_each_its_fields():
    raw = {"name": "shared", "defaults": {"model": "local:tiny-test", "reward": {
               "prm": "hf", "prm_model": "org/prm", "prm_device": "cpu", "teacher": "org/t", "incorrect_reward": -1.0}},
           "axes": {"regime": {"field": "reward.regime", "values": ["outcome", "process", "distillation"]}}}
    cells = {c.id: c.config.reward for c in cell_table(parse_study(raw)).cells}
    assert cells["outcome"].incorrect_reward == -1.0 and cells["outcome"].set_aside["teacher"] == "org/t"
    assert not hasattr(cells["outcome"], "teacher") and not hasattr(cells["process"], "incorrect_reward")
    assert (cells["process"].prm_model, cells["distillation"].teacher) == ("org/prm", "org/t")
    assert cells["process"].signature_extras() == {**{f: FLAT_LAYOUT[f] for f in ("teacher", "teacher_device",
                                                   "teacher_dtype")}, "teacher": "org/t", "incorrect_reward": -1.0}
    fixed = {**raw, "defaults": {"model": "local:tiny-test"},
             "axes": {"teacher": {"field": "reward.teacher", "values": ["org/a", "org/b"]}}}
    with pytest.raises(ValueError, match="reward.teacher applies to reward.regime 'distillation'; allowed with regime "
                                         "'outcome'"):
        cell_table(parse_study(fixed))  # an axis sets a field no cell's regime takes
