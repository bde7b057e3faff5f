"""The doctor's projection: a study with given axes, hand-made measurements."""

from __future__ import annotations

from pathlib import Path

from lorarl.language.study import load_study
from tests.support.study import tiny_study, write_study


SPLIT = {"rollout_generation_s": 1.0, "reward_s": 0.1, "old_policy_forward_and_advantages_s": 0.1,
         "scoring_s": 1.2, "reference_forward_s": 0.3, "policy_forward_backward_s": 0.5, "step_s": 2.0,
         "generation_rounds_per_step": 1.0, "kl_monitor_per_run_s": 0.0, "degenerate_rate": 0.5}


def _study(tmp_path: Path, axes: dict, **defaults) -> object:
    train = {"steps": 10, "prompts_per_step": 4, "generations": 2, "max_completion_length": 20, "beta": 0.0}
    spec = tiny_study("jobs", axes=axes, **{"adapter": None, "eval": None, "train": train, **defaults})
    return load_study(write_study(tmp_path / "s.yaml", spec))


def measurements(load: dict) -> dict:
    """A doctor run, by hand: every part's CPU time is half its wall time (the job got half a CPU)."""
    half = lambda w: {"wall_s": w, "cpu_s": w / 2}  # noqa: E731
    return {
        "split": SPLIT, "device": {"kind": "cpu"}, "model_load_s": 1.0, "diagnose_s": 4.0, "train_ranks": 1,
        "evaluation": {"synthetic": {"seconds_per_problem": 0.5, "problems": 4}}, "prompt_tokens": {},
        "phases": {"stack": half(10.0), "mlflow": half(4.0), "first_load": half(3.0), "model_load": half(1.0),
                   "regime": half(1.0), "train": half(2.0 + 10 * 2.0), "eval_first": half(3.5),
                   "eval:synthetic": half(1.0 + 4 * 0.5), "diagnose": half(4.0)},
        "clock": {"proc_s": 1.0, "process_start_epoch": 101.0, "entry_epoch": 102.0, "end_epoch": 150.0},
        "login": {"launcher": {"wall_s": 2.0, "cpu_s": 1.0, "study_s": 0.5}, "submitted_epoch": 100.0,
                  "returned_epoch": 153.0, "aggregate": half(6.0), "snakemake": half(5.0)},
        "load": load}
