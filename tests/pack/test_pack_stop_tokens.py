"""Packed rollouts stop at every EOS id of the model's generation config, as solo training does
(tests/test_stop_tokens.py): Gemma-3-1B-it's <end_of_turn> (106) ends a packed completion though its
tokenizer names only <eos> (1). The tiny model here lists two EOS ids in its generation config; its
policy always samples the second one first, so every completion is that one token, kept and masked in
exactly as TRL's solo trainer keeps and masks it."""

from __future__ import annotations

import torch

from tests.support.pack_steps import cell, fake_regimes


def _pack_with_forced_first_token(path, tmp_path, turn):
    """A pack of two cells whose first sampled token of every row is ``turn`` (its logit +1e4)."""
    from lorarl.pack.build import build_pack

    pack = fake_regimes(build_pack([cell(path, "a", 1, monitor=0), cell(path, "b", 2, monitor=0)],
                                   results_dir=tmp_path, device="cpu"))
    host = pack.loop.trainer.host
    head = [m for n, m in host.named_modules() if n.endswith("lm_head")][0]
    pos = {"n": 0}

    def bias(_m, _i, out):
        if pos["n"] == 0:  # the prefill: the logits of the first generated token
            out = out.clone()
            out[:, -1, turn] += 1e4
        pos["n"] += 1
        return out

    head.register_forward_hook(bias)
    return pack, pos


def test_the_pack_stops_at_every_eos_id_of_the_generation_config(two_eos_dir, tmp_path):
    from lorarl.models import load_model_and_tokenizer
    from lorarl.pack.generate import generate
    from lorarl.stop_ids import stop_token_ids

    path, turn = two_eos_dir
    model, tok = load_model_and_tokenizer(path)
    pack, pos = _pack_with_forced_first_token(path, tmp_path, turn)
    lp = pack.loop
    assert lp.sample.eos_token_ids == stop_token_ids(model, tok) == (tok.eos_token_id, turn)

    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    pos["n"] = 0
    ros = generate(lp.trainer.router, [lp.members[0].prompt_ids[:3], lp.members[1].prompt_ids[:2]], gens, lp.sample)
    assert [r.completion_ids for r in ros] == [[[turn]] * 3, [[turn]] * 2]  # ended at the second id, kept

    seen = {}
    real = lp.trainer.step

    def spy(batches):
        seen.update({k: (b["completion_ids"].clone(), b["completion_mask"].clone())
                     for k, b in enumerate(batches) if b is not None})
        return real(batches)

    lp.trainer.step = spy
    pos["n"] = 0
    rows = lp.step()
    for k, (ids, mask) in seen.items():  # P x G rows: the completion is `turn`, then padding masked out
        assert (ids[:, 0] == turn).all() and mask.sum(1).tolist() == [1] * ids.shape[0], k
    for name in ("a", "b"):
        assert rows[name]["frac_truncated"] == 0.0 and rows[name]["completions/mean_length"] == 1.0


def test_without_the_second_id_the_pack_runs_on(two_eos_dir, tmp_path):
    """The same forced policy with the generation config's second id dropped: rows run past it (the test can fail)."""
    import dataclasses

    from lorarl.pack.generate import generate

    path, turn = two_eos_dir
    pack, pos = _pack_with_forced_first_token(path, tmp_path, turn)
    lp = pack.loop
    only_tok = dataclasses.replace(lp.sample, eos_token_ids=tuple(i for i in lp.sample.eos_token_ids if i != turn))
    pos["n"] = 0
    ros = generate(lp.trainer.router, [lp.members[0].prompt_ids[:4], None], [torch.Generator().manual_seed(0), None],
                   only_tok)
    comps = ros[0].completion_ids
    assert all(c[0] == turn for c in comps) and any(len(c) > 1 for c in comps)
