"""GRPO cells with ``rollout.engine: vllm`` trained by lorarl's trainer (train_cell → TRL's colocated engine) on
vLLM's real CPU engine: the weights pushed every step reach the engine.

One process trains every cell once (module fixture; vLLM keeps each engine, in-process, ~5 s to start) on an
untrained model of the ``local:tiny-arith`` shape (head_dim 32: the CPU attention kernels refuse 16). After each
step's push, the engine's log-probs of the tokens it sampled match the trainer's (``rollout/logp_diff_mean``,
measured by lorarl's freshness gate) far inside ``rollout.freshness_threshold``, on adapters that have been
trained: LoRA (processed and raw log-probs), PiSSA (the push is the effective W0 - B0A0 + BA, not the residual
base layer), full fine-tuning, ``top_p < 1`` with raw log-probs. A cell of another seed samples other rollouts,
and an engine that is never pushed to trips the gate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.study import tiny_study

THRESHOLD = 0.05  # rollout.freshness_threshold (its default): the gate's bound on mean |logp_sampler - logp_policy|
STEPS = 3
ROLLOUT = {"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True, "freshness_threshold": THRESHOLD}
STUDY = tiny_study(
    "vllm_real", eval=None, model="local:tiny-arith", task={"name": "synthetic", "n_train": 32, "n_eval": 8},
    train={"steps": STEPS, "prompts_per_step": 2, "generations": 4, "max_completion_length": 12,
           "lr": 3e-2, "temperature": 1.0, "kl_monitor_every": 0, "checkpoint_every": 0},
    adapter={"method": "lora", "rank": 4}, rollout=ROLLOUT,
    axes={"c": {"values": [
        {"label": "lora", "set": {"seed": 0}},
        {"label": "lora_seed1", "set": {"seed": 1}},
        {"label": "lora_raw", "set": {"rollout.logprobs_mode": "raw"}},
        {"label": "lora_top_p", "set": {"rollout.logprobs_mode": "raw", "train.top_p": 0.5}},
        {"label": "pissa", "set": {"adapter.init": "pissa"}},
        {"label": "full", "set": {"adapter.method": "full", "adapter.rank": None, "train.lr": 1e-3}},
        # trained with its push dropped (the engine keeps the weights it was built from): the gate must trip
        {"label": "stale", "set": {"adapter.method": "full", "adapter.rank": None, "train.lr": 3e-2, "train.steps": 5,
                                   "rollout.freshness_threshold": 0.02, "rollout.freshness_patience": 2}},
    ]}})


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """results/models/tiny-arith: the recipe's shape and a tokenizer of its task, untrained (no SFT)."""
    from lorarl.models import RECIPES, build_tiny, build_tokenizer
    from lorarl.tasks.synthetic import make_splits

    res = tmp_path_factory.mktemp("vllm_real")
    recipe = RECIPES["tiny-arith"]
    assert recipe.hidden // recipe.heads >= 32  # vLLM's CPU attention kernels take head_dim 32, not 16
    train, _ = make_splits(recipe.task_seed, 200, 1, max_ops=recipe.max_operands, max_value=recipe.max_value)
    tok = build_tokenizer([p.prompt + p.solution for p in train] + ["0123456789+-=?\nQA: \\boxed{}"])
    model = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(res / "models" / "tiny-arith")
    tok.save_pretrained(res / "models" / "tiny-arith")
    return res


def text_score(completions, answers=None):
    """A deterministic, non-degenerate grade of a completion's text in [0, 1] (tests/train/test_grpo.py's)."""
    return [float(sum(map(ord, c)) % 5) / 4 for c in completions]


class Run:
    """One trained cell: its summary, trainer (log history, engine), the rollouts its engine sampled, or the error."""

    def __init__(self):
        self.summary, self.trainer, self.error, self.completions = None, None, None, []

    def metric(self, name: str) -> list[float]:
        return [row[name] for row in self.trainer.state.log_history if name in row]


def _train(results: Path, cell, stale: bool = False) -> Run:
    """train_cell with a spy on the trainer (AdaptedPolicy.attach) and on its engine's generate; ``stale``: the
    push is dropped (the engine keeps the weights it was built from)."""
    from lorarl.adapters.build import AdaptedPolicy
    from lorarl.train import vllm_sync
    from lorarl.train.main import train_cell

    run, mp = Run(), pytest.MonkeyPatch()
    real_attach = AdaptedPolicy.attach

    def spy(self, trainer):
        run.trainer = trainer
        trainer.regime.score_fn = text_score  # the untrained model never answers: a graded signal moves the policy
        gen = trainer.vllm_generation
        real_generate = gen.generate

        def generate(*a, **kw):
            out = real_generate(*a, **kw)
            run.completions.append([list(ids) for ids in out[1]])
            return out

        gen.generate = generate
        return real_attach(self, trainer)

    mp.setattr(AdaptedPolicy, "attach", spy)
    if stale:
        mp.setattr(vllm_sync, "push_weights", lambda llm, named_params: None)
    env = dict(os.environ)
    try:
        run.summary = train_cell("vllm_real", cell, results, threads=2)
    except Exception as err:  # the stale cell: RolloutStaleError
        run.error = err
    finally:
        mp.undo()
        os.environ.clear()
        os.environ.update(env)
    return run


@pytest.fixture(scope="module")
def runs(results) -> dict[str, Run]:
    from lorarl.language.study import parse_study, study_cells

    cells = {c.id: c for c in study_cells(parse_study(STUDY))}
    out = {cid: _train(results, cell, stale=cid == "stale") for cid, cell in cells.items()}
    return out


def test_every_cell_trains_on_the_real_cpu_engine(runs):
    import vllm

    for cid in ("lora", "lora_seed1", "lora_raw", "lora_top_p", "pissa", "full"):
        run = runs[cid]
        assert run.error is None, (cid, run.error)
        assert run.summary["state"] == "done" and run.summary["steps"] == STEPS, cid
        llm = run.trainer.vllm_generation.llm
        assert type(llm).__module__.startswith("vllm.") and vllm.__version__.startswith("0.31.0")
        assert llm.llm_engine.model_config.dtype == torch.float32  # fp32 trainer → fp32 engine (not auto's bf16)
        assert len(run.completions) == STEPS and all(len(c) == 8 for c in run.completions), cid


@pytest.mark.parametrize("cid,mode", [("lora", "processed_logprobs"), ("lora_raw", "raw_logprobs"),
                                      ("lora_top_p", "raw_logprobs"), ("pissa", "processed_logprobs"),
                                      ("full", "processed_logprobs")])
def test_pushed_weights_reach_the_engine(runs, cid, mode):
    """Every step after the first samples a policy the optimiser moved: the gap stays at float noise only if that
    step's push reached the engine (TRL's own load_weights push fails on the CPU build)."""
    run = runs[cid]
    assert run.trainer.rollout_settings["logprobs_mode"] == mode
    trained = {n: p for n, p in run.trainer.model.named_parameters() if p.requires_grad}
    if cid == "full":
        from transformers import AutoModelForCausalLM

        base = dict(AutoModelForCausalLM.from_pretrained(run.trainer.model.name_or_path).named_parameters())
        assert max((p - base[n]).abs().max().item() for n, p in trained.items()) > 1e-3  # the policy moved
    else:
        assert max(p.abs().max().item() for n, p in trained.items() if "lora_B" in n) > 1e-3  # B left zero
    diffs = run.metric("rollout/logp_diff_mean")
    assert len(diffs) == STEPS and max(diffs) < THRESHOLD / 10, (cid, diffs)
    assert max(run.metric("rollout/logp_diff_max")) < THRESHOLD, cid


def test_the_policy_moved_so_a_stale_engine_would_show(runs):
    """The pushes above carry trained weights: the same engine without pushes drifts past the threshold."""
    run = runs["stale"]
    from lorarl.train.rollout import RolloutStaleError

    assert isinstance(run.error, RolloutStaleError), run.error
    assert "not sampling the trained policy" in str(run.error)
    diffs = run.metric("rollout/logp_diff_mean")
    assert diffs[0] < 1e-3 and diffs[-1] > 0.02 and run.trainer.state.global_step < 5, diffs


def test_pissa_pushes_the_effective_weight_not_the_residual(runs):
    """The PiSSA base layer holds W0 - B0A0; the engine must hold W0 - B0A0 + BA (lorarl.train.rollout's
    effective weights): its log-probs match the trained policy's, and those of the residual alone do not."""
    from lorarl.train.rollout import effective_named_params

    run = runs["pissa"]
    model = run.trainer.model
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    residual = layer.base_layer.weight
    effective = dict(effective_named_params(model))["model.layers.0.self_attn.q_proj.weight"]
    assert (effective - residual).abs().max() > 1e-2  # BA is far from zero: pushing the residual would be stale
    assert max(run.metric("rollout/logp_diff_mean")) < THRESHOLD / 10


def test_a_cell_of_another_seed_samples_other_rollouts(runs):
    a, b = runs["lora"].completions[0], runs["lora_seed1"].completions[0]
    assert a != b
    assert runs["lora"].trainer.vllm_generation.llm.llm_engine.model_config.seed == 0
    assert runs["lora_seed1"].trainer.vllm_generation.llm.llm_engine.model_config.seed == 1
