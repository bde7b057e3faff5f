"""The doctor's projection: prompt tokens in the token budget, DAPO refill rounds, PPO mini-batches, and the
step split it starts from (lorarl.pipeline.doctor.job.step_split, lorarl.doctor_projection)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from lorarl.pipeline.doctor.job import step_split
from lorarl.pipeline.doctor.projection import expected_rounds, project, prompt_tokens_by_cell, step_seconds
from lorarl.language.study import load_study, study_cells
from tests.support.study import tiny_study

SPLIT = {"rollout_generation_s": 1.0, "reward_s": 0.1, "old_policy_forward_and_advantages_s": 0.1,
         "scoring_s": 1.2, "reference_forward_s": 0.3, "policy_forward_backward_s": 0.5, "step_s": 2.0,
         "generation_rounds_per_step": 1.0, "kl_monitor_per_run_s": 0.0, "degenerate_rate": 0.5}


def simulate_rounds(p: float, groups: int, max_rounds: int, trials: int, seed: int = 0) -> float:
    """The refill loop of LorarlGRPOTrainer._refill with groups degenerate at random (rate p)."""
    rng = random.Random(seed)
    total = 0
    for _ in range(trials):
        kept, rounds = sum(rng.random() >= p for _ in range(groups)), 1
        while kept < groups and rounds < max_rounds:
            kept += sum(rng.random() >= p for _ in range(groups))
            rounds += 1
        total += rounds
    return total / trials


def test_expected_rounds_edges_geometric_case_and_the_refill_loop():
    assert expected_rounds(0.0, 8, 3) == 1.0 and expected_rounds(1.0, 8, 3) == 3.0
    assert expected_rounds(0.7, 8, 1) == 1.0  # one round allowed: no refill whatever p is
    for p in (0.2, 0.5, 0.9):  # one group per step: R is geometric, capped at M
        assert expected_rounds(p, 1, 4) == pytest.approx((1 - p ** 4) / (1 - p), rel=1e-12)
    values = [expected_rounds(p, 8, 5) for p in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert values == sorted(values) and 1 < values[0] and values[-1] < 5
    for p, P, M in ((0.3, 8, 3), (0.6, 16, 5), (0.45, 4, 10)):
        assert expected_rounds(p, P, M) == pytest.approx(simulate_rounds(p, P, M, 20000), abs=0.03)
    with pytest.raises(ValueError, match="not a probability"):
        expected_rounds(1.5, 8, 3)


def test_step_split_sums_refill_rounds_and_counts_steps_without_a_rollout(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,time/step_s,time/score_s,time/generate_s,time/reward_s,time/ref_forward_s,"
                   "rollout/tokens,dynamic_sampling/rounds,rollout/degenerate_rate\n"
                   "1,9,9,9,9,9,9,1,0.9\n"  # warm-up: dropped
                   "2,4.0,1.0,0.8,0.1,0.2,50,3,0.5\n"  # 3 rounds: TRL logged each per-round value's mean
                   "3,2.0,1.0,0.8,0.1,0.2,50,1,0.3\n"
                   "4,1.0,,,,,,,\n")  # a PPO mini-batch step: no rollout
    sp = step_split(csv)
    assert sp["rollout_generation_s"] == pytest.approx((2.4 + 0.8) / 3)
    assert sp["scoring_s"] == pytest.approx((3.0 + 1.0) / 3) and sp["reward_s"] == pytest.approx(0.4 / 3)
    assert sp["reference_forward_s"] == pytest.approx(0.4 / 3)  # once per rollout, after the refills
    assert sp["generation_rounds_per_step"] == pytest.approx(4 / 3)
    assert sp["rollout_tokens_per_step"] == pytest.approx(200 / 3) and sp["degenerate_rate"] == pytest.approx(0.4)
    assert sp["step_s"] == pytest.approx(7 / 3)
    parts = sp["scoring_s"] + sp["reference_forward_s"] + sp["policy_forward_backward_s"]
    assert parts == pytest.approx(sp["step_s"])


def _study(tmp_path: Path, axes: dict, **train) -> object:
    spec = tiny_study("proj", adapter=None, eval=None, task={"name": "synthetic", "n_train": 64},
                      train={"steps": 10, "prompts_per_step": 4, "generations": 2,
                             "max_completion_length": 20, **train},
                      axes=axes)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_study(tmp_path / "s.yaml")


def test_step_seconds_scales_each_part_by_its_tokens_and_rounds(tmp_path, monkeypatch):
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    axes = {"v": {"values": [
        {"label": "same", "set": {"seed": 0}},
        {"label": "dapo", "set": {"train.dynamic_sampling": True, "train.dynamic_sampling_max_batches": 4}},
        {"label": "long", "set": {"train.max_completion_length": 40}},
        {"label": "mini", "set": {"train.mini_batch_prompts": 2}},
        {"label": "nokl", "set": {"train.beta": 0.0}},
    ]}}
    cells = {c.id: c.config for c in study_cells(_study(tmp_path, axes, beta=0.05))}
    smoke = cells["same"]
    # same cell, same prompt: the measured step
    assert step_seconds(smoke, SPLIT, smoke, 10.0, 10.0, 0.5) == (pytest.approx(2.0), 1.0)
    # prompts twice as long (20 vs 10 tokens): generation stays, every forward reads 40/30 of the tokens
    step, _ = step_seconds(smoke, SPLIT, smoke, 20.0, 10.0, 0.5)
    assert step == pytest.approx(1.0 + (0.2 + 0.3 + 0.5) * 40 / 30)
    # DAPO: E[R] rounds of generation + scoring; the reference and the update once
    step, rounds = step_seconds(cells["dapo"], SPLIT, smoke, 10.0, 10.0, 0.5)
    assert rounds == pytest.approx(expected_rounds(0.5, 4, 4)) and 1 < rounds < 4
    assert step == pytest.approx(rounds * 1.2 + 0.3 + 0.5)
    step, rounds = step_seconds(cells["dapo"], SPLIT, smoke, 10.0, 10.0, None)  # rate unknown: the upper bound
    assert rounds == 4 and step == pytest.approx(4 * 1.2 + 0.8)
    # completion budget 40 (prompt 10): generation x2, forwards x50/30
    step, _ = step_seconds(cells["long"], SPLIT, smoke, 10.0, 10.0, 0.5)
    assert step == pytest.approx(2.0 + (0.2 + 0.3 + 0.5) * 50 / 30)
    # two PPO mini-batches per rollout: a rollout (and its reference forward) every 2 steps, half a batch each
    step, _ = step_seconds(cells["mini"], SPLIT, smoke, 10.0, 10.0, 0.5)
    assert step == pytest.approx(1.2 / 2 + 0.3 / 2 + 0.5 / 2)
    # beta 0: no reference forward; a smoke cell with beta 0 measured none: a third of the forward/backward
    assert step_seconds(cells["nokl"], SPLIT, smoke, 10.0, 10.0, 0.5)[0] == pytest.approx(1.7)
    no_ref = {**SPLIT, "reference_forward_s": 0.0, "step_s": 1.7}
    assert step_seconds(smoke, no_ref, cells["nokl"], 10.0, 10.0, 0.5)[0] == pytest.approx(1.7 + 0.5 / 3)


def test_projection_uses_each_cells_prompt_tokens_and_refills(tmp_path, monkeypatch):
    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    axes = {"ds": {"field": "train.dynamic_sampling", "prefix": "ds", "values": [False, True]},
            "sys": {"values": [{"label": "plain", "set": {"seed": 0}},
                               {"label": "sys", "set": {"prompt.system": "You are a careful solver."}}]}}
    study = _study(tmp_path, axes, kl_monitor_every=0, beta=0.05)
    cells = study_cells(study)
    prompts = {"dsFalse-plain": 10.0, "dsTrue-plain": 10.0, "dsFalse-sys": 25.0}  # dsTrue-sys: not measured
    m = {"split": SPLIT, "model_load_s": 3.0, "diagnose_s": 0.0, "device": {"kind": "cuda"}, "evaluation": {},
         "prompt_tokens": prompts, "prompt_tokens_notes": ["dsTrue-sys: prompt length not measured (OSError: x)"]}
    prof = {"name": "slurm", "launcher": "slurm", "jobs": 2, "slurm": {"train": {"gpus_per_node": 1}}}
    p = project(study, cells[0], m, prof)
    by = {c.id: c.config for c in cells}
    want = 0.0
    for cid, prompt in [("dsFalse-plain", 10.0), ("dsTrue-plain", 10.0), ("dsFalse-sys", 25.0), ("dsTrue-sys", 10.0)]:
        want += 3.0 + 10 * step_seconds(by[cid], SPLIT, by["dsFalse-plain"], prompt, 10.0, 0.5)[0]
    assert p["train_h"] == pytest.approx(want / 3600)
    rows = {r["cell"]: r for r in p["per_cell"]}
    assert rows["dsTrue-plain"]["rounds_per_rollout"] == pytest.approx(expected_rounds(0.5, 4, 3), abs=1e-3)
    assert rows["dsFalse-sys"]["step_s"] > rows["dsFalse-plain"]["step_s"] == pytest.approx(2.0)
    assert rows["dsTrue-sys"]["prompt_tokens"] == 10.0  # fell back to the smoke cell's, and says so
    text = "\n".join(p["assumptions"])
    assert "p = 0.5" in text and "2 cells use DAPO" in text and "P x G x (prompt + max_completion_length)" in text
    assert "dsTrue-sys: prompt length not measured" in text and p["degenerate_rate"] == 0.5


def test_prompt_tokens_are_measured_per_cell_with_its_tokenizer_and_prompt(tmp_path):
    from transformers import AutoTokenizer

    from lorarl.models import TinyRecipe, build_tiny, build_tokenizer
    from lorarl.tasks import task_records

    d = tmp_path / "models" / "tiny-test"
    tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-*=?()\nQA: \\boxed{}"] * 20,
                          vocab_size=300)
    build_tiny(TinyRecipe(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32), len(tok), tok.eos_token_id,
               tok.pad_token_id).save_pretrained(d)
    tok.save_pretrained(d)
    axes = {"sys": {"values": [{"label": "plain", "set": {"seed": 0}},
                               {"label": "sys", "set": {"prompt.system": "Solve it: a b c d e f."}},
                               {"label": "plain2", "set": {"seed": 1}}]}}
    study = _study(tmp_path, axes)
    got, notes = prompt_tokens_by_cell(str(tmp_path / "s.yaml"), str(tmp_path))
    assert notes == [] and set(got) == {"plain", "sys", "plain2"} and got["plain"] == got["plain2"]
    loaded = AutoTokenizer.from_pretrained(d)
    rows = task_records(study_cells(study)[0].config.task)[0]
    direct = [len(loaded(text=[r["prompt"]])["input_ids"][0]) for r in rows]
    assert got["plain"] == pytest.approx(sum(direct) / len(direct)) and got["sys"] > got["plain"] + 5
    got, notes = prompt_tokens_by_cell(str(tmp_path / "s.yaml"), str(tmp_path / "elsewhere"))  # no model there
    assert got == {} and len(notes) == 2 and "prompt length not measured" in notes[0]


def test_step_split_counts_the_updates_of_a_training_step(tmp_path):
    """train.steps counts rollout batches: with 2 mini-batch updates a metrics row covers 2 updates
    (its `update` column), so the per-update generation cost is half a row's."""
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,update,time/step_s,time/score_s,time/generate_s,time/reward_s,time/ref_forward_s,"
                   "rollout/tokens,dynamic_sampling/rounds,rollout/degenerate_rate\n"
                   "1,2,9,9,9,9,9,9,1,0.9\n"  # warm-up: dropped
                   "2,4,1.5,2.0,1.6,0.2,0.0,80,1,0.5\n"
                   "3,6,1.5,2.0,1.6,0.2,0.0,80,1,0.5\n")
    sp = step_split(csv)
    assert sp["rollout_generation_s"] == pytest.approx(3.2 / 4) and sp["generation_rounds_per_step"] == pytest.approx(0.5)
    assert sp["step_s"] == pytest.approx(1.5)  # TRL's time/step_s: already a mean per update
