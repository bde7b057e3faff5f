"""Training rollouts stop at every EOS id of the model's generation config, not only the tokenizer's
(Gemma-3-1B-it: <eos> 1 and <end_of_turn> 106; evaluation stops at both too, lorarl.evaluate.backends).

TRL 1.16 does it itself: GRPOTrainer.__init__ merges ``model.generation_config.eos_token_id`` with the
tokenizer's EOS into ``eos_token_ids`` (trl/trainer/grpo_trainer.py 408-416), which the HF engine's
GenerationConfig receives (line 1160) and the completion mask cuts at (line 1881); the colocated vLLM
engine is built on the same checkpoint folder (``LLM(model=model.name_or_path)``), whose
generation_config.json vLLM reads by default (generation_config="auto") and adds its EOS ids to every
request's stop ids. This test holds the HF path on a tiny model whose generation config has two EOS
ids, loaded exactly as training loads it (lorarl.models.load_model_and_tokenizer)."""

from __future__ import annotations

from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.stop_ids import stop_token_ids
from lorarl.train.trainer import LorarlGRPOTrainer
from tests.support.grpo import G, MAXLEN, P, args, dataset, fake_score, raw_batch


def _rollout(path, tmp_path, turn, eos_ids=None):
    from lorarl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(path)
    if eos_ids is not None:
        model.generation_config.eos_token_id = eos_ids
    # the policy always samples `turn` first (its logit +1e4), then anything
    pos = {"n": 0}

    def bias(_m, _i, out):
        if pos["n"] == 0:  # the first forward of generation: the first generated token
            out = out.clone()
            out[:, -1, turn] += 1e4
        pos["n"] += 1
        return out

    model.lm_head.register_forward_hook(bias)
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score),
                                args=args(tmp_path, max_steps=1), train_dataset=dataset(), processing_class=tok)
    trainer.model.train()
    pos["n"] = 0
    out = trainer._generate_and_score_completions(raw_batch(dataset()))
    return trainer, out, tok


def test_training_rollouts_stop_at_every_eos_id_of_the_generation_config(two_eos_dir, tmp_path):
    path, turn = two_eos_dir
    trainer, out, tok = _rollout(path, tmp_path, turn)
    assert set(trainer.eos_token_ids) == {tok.eos_token_id, turn}
    assert stop_token_ids(trainer.model, tok) == tuple(trainer.eos_token_ids)  # the pack's rule is TRL's
    ids, mask = out["completion_ids"], out["completion_mask"]
    assert ids.shape[0] == P * G and (ids[:, 0] == turn).all()
    assert mask.sum(1).tolist() == [1] * (P * G)  # each completion ends at the second stop id


def test_one_eos_id_runs_on(two_eos_dir, tmp_path):
    """The same policy with only the tokenizer's EOS: the second id does not stop it (the test can fail)."""
    path, turn = two_eos_dir
    from lorarl.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(path)
    trainer, out, _ = _rollout(path, tmp_path / "one", turn, eos_ids=tok.eos_token_id)
    assert trainer.eos_token_ids == [tok.eos_token_id]
    assert stop_token_ids(trainer.model, tok) == (tok.eos_token_id,)
    assert (out["completion_mask"].sum(1) > 1).any() and out["completion_ids"].shape[1] <= MAXLEN


def test_evaluation_stops_where_training_stops(two_eos_dir, tmp_path):
    """The HF evaluation backend merges the generation config's EOS ids with the tokenizer's as training does
    (TRL's rule): a generation config listing only <end_of_turn> still stops at the tokenizer's EOS too."""
    import json
    import shutil

    from lorarl.evaluate.backends import HFBackend

    src, turn = two_eos_dir
    d = tmp_path / "turn_only"
    shutil.copytree(src, d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = [turn]
    (d / "generation_config.json").write_text(json.dumps(gen))
    backend = HFBackend(str(d))
    assert backend.eos_ids == [backend.tokenizer.eos_token_id, turn]
    assert tuple(backend.eos_ids) == stop_token_ids(backend.model, backend.tokenizer)
    assert HFBackend(src).eos_ids == [backend.tokenizer.eos_token_id, turn]  # both listed: kept as listed
