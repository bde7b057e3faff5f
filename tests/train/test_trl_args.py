"""lorarl.train.trl_args is the one translation of a cell config into TRL: GRPOConfig fields and the
trainer's constructor options. `train.beta` reaches the trainer as `kl_beta`; TRL's `beta` is 0 and
no code changes `args` afterwards."""

from __future__ import annotations

import datasets
import pytest

from lorarl.language.config import CellConfig, RolloutConfig


def cfg_with(**train) -> CellConfig:
    base = {"steps": 2, "prompts_per_step": 2, "generations": 2, "max_completion_length": 6, "kl_monitor_every": 0}
    return CellConfig.model_validate({"train": {**base, **train}})


def test_every_trainer_option_is_in_grpo_args(tmp_path):
    from lorarl.train.trl_args import grpo_args

    a = grpo_args(cfg_with(beta=0.05, num_iterations=2, scale_rewards="none", kl_importance_correction=False),
                  tmp_path, use_cpu=True)
    assert a.beta == 0.0  # lorarl's own KL term: TRL never runs its reference code
    assert (a.num_iterations, a.scale_rewards, a.use_bias_correction_kl, a.use_vllm) == (2, "none", False, False)
    vllm = CellConfig.model_validate({"rollout": {"engine": "vllm", "gpu_memory_utilization": 0.4}})
    v = grpo_args(vllm, tmp_path, use_cpu=True)
    assert (v.use_vllm, v.vllm_mode, v.vllm_gpu_memory_utilization, v.vllm_importance_sampling_correction) == (
        True, "colocate", 0.4, True)


def test_rollout_fields_follow_the_engine():
    from lorarl.train.trl_args import rollout_fields

    assert rollout_fields(None) == {"use_vllm": False} == rollout_fields(RolloutConfig())
    assert rollout_fields(RolloutConfig(engine="vllm", sleep_mode=True))["vllm_enable_sleep_mode"] is True


def test_vllm_context_defaults_to_the_prompt_and_completion_budget(tmp_path):
    """max_model_length null: the engine's context is the cell's prompt + completion budget, not the model's full
    context (vLLM refuses to start a long-context model whose KV cache for that context does not fit)."""
    from lorarl.train.trl_args import grpo_args

    def ctx(**rollout):
        cfg = CellConfig.model_validate({"rollout": {"engine": "vllm", **rollout},
                                         "train": {"max_prompt_length": 512, "max_completion_length": 1024}})
        return grpo_args(cfg, tmp_path, use_cpu=True).vllm_max_model_length

    assert ctx() == 512 + 1024
    assert ctx(max_model_length=4096) == 4096  # an explicit context wins
    unlimited = CellConfig.model_validate({"rollout": {"engine": "vllm"}})  # prompts without a limit: the model's
    assert unlimited.train.max_prompt_length is None
    assert grpo_args(unlimited, tmp_path, use_cpu=True).vllm_max_model_length is None


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_beta_reaches_the_trainer_once_and_args_stay_as_built(tiny_dir, tmp_path, beta):
    from lorarl.models import load_model_and_tokenizer
    from lorarl.train.prepare import reward_of
    from lorarl.train.trl_args import build_trainer, grpo_args

    cfg = cfg_with(beta=beta, num_iterations=2)
    model, tok = load_model_and_tokenizer(tiny_dir)
    ds = datasets.Dataset.from_list([{"prompt": f"Q: {i}+{i}=?\nA: ", "answer": str(2 * i)} for i in range(8)])
    args = grpo_args(cfg, tmp_path / "o", use_cpu=True)
    before = args.to_dict()
    regime, grading = reward_of(cfg, tok, tmp_path, "cpu")
    trainer = build_trainer(cfg, model=model, tokenizer=tok, args=args, train_dataset=ds, ref_model="auto",
                            regime=regime, grading=grading)
    assert args.to_dict() == before  # nothing mutates the translated arguments
    assert trainer.kl_beta == beta and trainer.args.beta == 0.0 and trainer.beta == 0.0
    assert (trainer.reference_model is not None) == (beta > 0)
    assert trainer.num_iterations == 2


def test_trainer_refuses_a_nonzero_trl_beta(tiny_dir, tmp_path):
    from lorarl.models import load_model_and_tokenizer
    from lorarl.rewards.outcome import OutcomeDeposits
    from lorarl.train.trainer import LorarlGRPOTrainer
    from lorarl.train.trl_args import grpo_args

    args = grpo_args(cfg_with(), tmp_path / "o", use_cpu=True)
    args.beta = 0.05
    model, tok = load_model_and_tokenizer(tiny_dir)
    ds = datasets.Dataset.from_list([{"prompt": "Q: 1+1=?\nA: ", "answer": "2"}] * 4)
    with pytest.raises(ValueError, match="kl_beta"):
        LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=lambda c, a: [0.0] * len(c)), args=args,
                          train_dataset=ds, processing_class=tok)
