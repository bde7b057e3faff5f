"""A reward regime's facts live in its registry entry (lorarl.rewards.RegimeSpec) and its class: a regime
registered in one place reaches every planner (local recipes, hub check, memory plan, training ranks, config
validation, report bounds) with no name tested elsewhere (tests/test_structure.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lorarl.spec import hubcheck
from lorarl.spec.config import CellConfig, RewardConfig
from lorarl.memory.plan import shape_of
from lorarl.memory.ranks import has_aux
from lorarl.models import cell_models, study_recipes
from lorarl.report.bounds import outcome_bounds
from lorarl.rewards import REGIMES, ExtraModel, RegimeSpec
from lorarl.rewards.distillation import DistillationDeposits
from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.rewards.process import ProcessDeposits
from lorarl.rewards.registry import extra_models


def _judge(cfg):
    """A new regime's extra model: a judge named by `reward.prm_model`, built from a local recipe if so named."""
    return [ExtraModel("judge", "reward.prm_model", cfg.prm_model, "float32", 3, local_recipe=True)]


def _needs_judge(cfg):
    if not cfg.prm_model:
        raise ValueError("reward.prm_model is required when reward.regime is 'judge'")


@pytest.fixture
def judge(monkeypatch):
    monkeypatch.setitem(REGIMES, "judge", RegimeSpec("judge", lambda *a, **kw: None, extra_models=_judge,
                                                     check=_needs_judge, reward_range=lambda cfg: (-1.0, 2.0)))


def test_a_new_regime_reaches_every_planner_through_its_spec(judge):
    cell = CellConfig(model="local:tiny-test", reward={"regime": "judge", "prm_model": "local:tiny-arith"})
    assert cell_models(cell) == ["local:tiny-test", "local:tiny-arith"]
    assert study_recipes([SimpleNamespace(config=cell)]) == ["tiny-test", "tiny-arith"]  # built before the cell
    assert has_aux(cell)  # on one node of 2 GPUs the judge takes the second
    (role, arch, nbytes, batch), = shape_of(cell, "cpu")[0].aux
    assert (role, arch.name, nbytes, batch) == ("judge", "local:tiny-arith", 4, 3)  # its dtype and batch size
    hub = CellConfig(model="local:tiny-test", reward={"regime": "judge", "prm_model": "org/judge-7b"})
    assert [(r.field, r.repo) for r in hubcheck.references(hub) if r.kind == "model"] == [("reward.prm_model", "org/judge-7b")]
    with pytest.raises(ValueError, match="reward.prm_model is required when reward.regime is 'judge'"):
        RewardConfig(regime="judge")
    with pytest.raises(ValueError, match="reward.terms applies to reward.regime 'outcome' .*allowed with regime 'judge'"):
        RewardConfig(regime="judge", prm_model="x", terms={"correct": 1.0})
    overlong = CellConfig(reward={"regime": "judge", "prm_model": "x"}, train={"overlong_buffer": 8, "overlong_factor": 0.5})
    assert outcome_bounds(overlong) == (-1.5, 2.0)  # its range, less the overlong shaping


def test_the_built_in_regimes_facts():
    assert [x.role for x in extra_models(RewardConfig())] == []
    assert extra_models(RewardConfig(regime="process")) == []  # the rule checker loads nothing
    prm, = extra_models(RewardConfig(regime="process", prm="hf", prm_model="org/prm", prm_batch_size=2))
    assert (prm.role, prm.field, prm.model, prm.dtype, prm.batch_size, prm.local_recipe) == (
        "prm", "reward.prm_model", "org/prm", "auto", 2, False)  # a PRM is loaded by its hub id, never built
    teacher, = extra_models(RewardConfig(regime="distillation", teacher="local:tiny-arith", teacher_dtype="bfloat16"))
    assert (teacher.role, teacher.field, teacher.dtype, teacher.local_recipe) == ("teacher", "reward.teacher", "bfloat16", True)
    assert [(c.needs_gold, c.reports_accuracy, c.needs_student_logps)
            for c in (OutcomeDeposits, ProcessDeposits, DistillationDeposits)] == [
        (True, True, False), (False, False, False), (False, False, True)]  # only outcome sees gold and grades
    assert REGIMES["outcome"].takes_terms and not REGIMES["process"].takes_terms
