"""A cell's paused run and its uninterrupted one: fake rewards, a run's outputs, its MLflow steps."""

from __future__ import annotations

import json

import pandas as pd


NOISY = ("time/", "pack/", "tokens_per_s", "step_time")  # wall-clock and pack size: not part of the result


def patch_fake_rewards(monkeypatch):
    """Outcome graded by tests/support/grpo.py's deterministic non-degenerate fake (an untrained model is never right)."""
    from lorarl.pack import build
    from lorarl.rewards.outcome import OutcomeDeposits, settings_of
    from tests.support.grpo import fake_score
    from tests.support.pack_steps import fake_regimes

    real = build.build_pack
    monkeypatch.setattr(build, "build_pack", lambda *a, **kw: fake_regimes(real(*a, **kw)))
    monkeypatch.setattr("lorarl.train.prepare.reward_of",
                        lambda cfg, *a, **kw: (OutcomeDeposits(score_fn=fake_score), settings_of(cfg.reward)))
    monkeypatch.setenv("LORARL_LOCK_WAIT_S", "0")


def outputs(d):
    from safetensors.torch import load_file

    rows = pd.read_csv(d / "metrics.csv")
    keep = [c for c in rows.columns if not c.startswith(NOISY)]
    return load_file(str(d / "adapter" / "adapter_model.safetensors")), rows[keep], json.loads((d / "summary.json").read_text())


def mlflow_steps(results, run_id, key="reward"):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{results}/mlflow.db")
    return sorted(m.step for m in client.get_metric_history(run_id, key)), client.get_run(run_id)
