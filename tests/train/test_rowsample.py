"""HF rollouts in chunks (rollout.generation_batch_size, lorarl.train.rowsample): the solo trainer's and
the pack's samples are the same whatever the chunk size (1, 3 with an uneven last chunk, null) and whatever
the KV cache (runtime.generation.cache static or dynamic, lorarl.decoding), they still depend on the seed, and
the sampler draws from the warped distribution."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lorarl.decoding import GenerationEngine
from lorarl.train.rowsample import chunk_slices, inverse_cdf
from tests.support.grpo import args, dataset, fake_score, load
from tests.support.tiny_model import used_static

ROWS, MAXLEN = 8, 10
CHUNKS = [None, 1, 3, ROWS]  # 3: chunks of 3, 3 and 2 rows
STATIC = GenerationEngine(cache="static")  # the default on this CPU is the dynamic cache (lorarl.decoding)


def test_chunk_slices():
    assert chunk_slices(8, None) == [slice(0, 8)] == chunk_slices(8, "auto") == chunk_slices(8, 9)
    assert chunk_slices(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    with pytest.raises(ValueError, match="generation_batch_size"):
        chunk_slices(8, 0)


def test_inverse_cdf_draws_the_categorical_distribution():
    probs_V = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    n = 10_000
    u_N = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # an even grid of uniforms: exact frequencies
    tok_N = inverse_cdf(probs_V.expand(n, -1), u_N)
    freq_V = torch.bincount(tok_N, minlength=5).float() / n
    torch.testing.assert_close(freq_V, probs_V, atol=2 / n, rtol=0)
    edge = inverse_cdf(probs_V.expand(2, -1), torch.tensor([0.0, torch.nextafter(torch.tensor(1.0, dtype=torch.float64),
                                                                                  torch.tensor(0.0, dtype=torch.float64))]))
    assert edge.tolist() == [0, 3]  # never a token of probability 0, even at u ~ 1


@pytest.fixture(scope="module")
def eos_model(tiny_dir):
    """The tiny policy with its EOS made likely, so rows end at different steps inside a chunk."""
    model, tok = load(tiny_dir)
    eos = tok.eos_token_id

    def bias(_m, _i, out):
        out = out.clone()
        out[..., eos] += 3.0
        return out

    model.lm_head.register_forward_hook(bias)
    return model, tok


def solo_samples(trainer, tok, chunk, seed, engine=None):
    from lorarl.train.streams import sampling_generator

    trainer.generation_batch_size, trainer.generation_engine = chunk, engine
    prompts = [tok(f"Q: {i}+{3 * i}=?" + " x" * (i % 3))["input_ids"] for i in range(ROWS)]  # uneven widths
    trainer.sample_generator = sampling_generator(seed)  # the cell's sampling stream (lorarl.train.streams)
    ids, logprobs = trainer._generate_single_turn(prompts, None, {}, 2)
    assert logprobs is None and len(ids) == ROWS
    return ids, trainer.sample_generator.get_state()  # the stream after the rollouts: the same for every chunking


def test_solo_chunked_rollouts_equal_one_batch_and_depend_on_the_seed(eos_model, tmp_path):
    from lorarl.rewards.outcome import OutcomeDeposits
    from lorarl.train.trainer import LorarlGRPOTrainer

    model, tok = eos_model
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score),
                                args=args(tmp_path, max_steps=1, max_completion_length=MAXLEN, temperature=0.9,
                                          top_p=0.95), train_dataset=dataset(), processing_class=tok)
    ref, after = solo_samples(trainer, tok, None, 5)
    lengths = {len(c) for c in ref}
    assert len(lengths) > 1 and max(lengths) <= MAXLEN  # rows end at different steps: the test can fail
    assert all(c[-1] == tok.eos_token_id for c in ref if len(c) < MAXLEN)
    assert not used_static(model)
    for chunk in CHUNKS[1:]:
        ids, rng = solo_samples(trainer, tok, chunk, 5)
        assert ids == ref, chunk
        assert torch.equal(rng, after), chunk
    ids, rng = solo_samples(trainer, tok, 3, 5, STATIC)  # a static KV cache: the same tokens, the same stream
    assert ids == ref and torch.equal(rng, after) and used_static(model)
    assert solo_samples(trainer, tok, 3, 6)[0] != ref  # another seed, other samples


def test_solo_rollouts_apply_the_sampling_warpers(eos_model, tmp_path):
    """top_k=1 leaves one token: the rollouts are HF's greedy decoding, whatever the uniforms."""
    from lorarl.rewards.outcome import OutcomeDeposits
    from lorarl.train.trainer import LorarlGRPOTrainer

    model, tok = eos_model
    trainer = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=fake_score),
                                args=args(tmp_path, max_steps=1, max_completion_length=MAXLEN, top_k=1),
                                train_dataset=dataset(), processing_class=tok)
    ids, _ = solo_samples(trainer, tok, 3, 5)
    prompt = tok("Q: 1+3=? x")["input_ids"]
    greedy = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            do_sample=False, max_new_tokens=MAXLEN, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    assert ids[1] == greedy[: len(ids[1])] and len(ids[1]) in (len(greedy), MAXLEN)
    assert solo_samples(trainer, tok, 3, 5, STATIC)[0] == ids  # greedy through a static KV cache: the same tokens


def test_pack_chunked_rollouts_equal_one_batch_and_depend_on_the_seed(tiny_dir, tmp_path):
    from lorarl.pack.build import build_pack
    from lorarl.pack.generate import generate
    from tests.support.pack_steps import cell

    cells = [cell(tiny_dir, "a", 1, temperature=0.9), cell(tiny_dir, "b", 2, top_p=0.9)]
    for c in cells:
        c.config.rollout.generation_batch_size = 3
        c.config.runtime.generation.cache = "dynamic"
    pack = build_pack(cells, results_dir=tmp_path)
    lp = pack.loop
    assert lp.sample.generation_batch_size == 3  # the cells' rollout.generation_batch_size reaches the sampler
    assert lp.sample.engine.cache == "dynamic"  # and their runtime.generation
    prompts = [lp.members[0].prompt_ids[:5], lp.members[1].prompt_ids[2:5]]  # 8 rows: chunks of 3 cross the cells

    def samples(chunk, seeds=(11, 12), engine=None, temperature=None):
        s = dataclasses.replace(lp.sample, generation_batch_size=chunk, engine=engine or lp.sample.engine)
        s = s if temperature is None else dataclasses.replace(s, temperature=temperature)
        gens = [torch.Generator().manual_seed(x) for x in seeds]
        ros = generate(lp.trainer.router, prompts, gens, s)
        return [r.completion_ids for r in ros], [g.get_state() for g in gens]

    ref, states = samples(None)
    assert len({tuple(c) for r in ref for c in r}) == 8  # distinct samples: the comparison can fail
    for chunk in CHUNKS[1:]:
        got, st = samples(chunk)
        assert got == ref, chunk
        assert all(torch.equal(a, b) for a, b in zip(st, states)), chunk  # each cell's stream consumed alike
    got, st = samples(3, engine=STATIC)  # a static KV cache: the same tokens, each cell's stream consumed alike
    assert got == ref and all(torch.equal(a, b) for a, b in zip(st, states))
    cold = 1e-4  # near-greedy: the top token takes the whole mass
    assert samples(3, engine=STATIC, temperature=cold)[0] == samples(None, temperature=cold)[0]
    other, _ = samples(3, seeds=(11, 99))
    assert other[0] == ref[0] and other[1] != ref[1]  # cell b's seed changes b's samples only


def test_the_cell_setting_reaches_the_solo_trainer(tiny_dir, tmp_path):
    from lorarl.language.config import CellConfig
    from lorarl.memory.measure import tiny_trainer

    cfg = CellConfig.model_validate({"model": str(tiny_dir), "adapter": {"method": "lora", "rank": 2},
                                     "train": {"prompts_per_step": 2, "generations": 2, "max_completion_length": 4},
                                     "rollout": {"generation_batch_size": 3},
                                     "runtime": {"generation": {"cache": "static", "compile": "off"}}})
    trainer, _ = tiny_trainer(str(tiny_dir), cfg, str(tmp_path))
    assert trainer.generation_batch_size == 3
    assert trainer.generation_engine == GenerationEngine(cache="static", compile="off")  # runtime.generation
