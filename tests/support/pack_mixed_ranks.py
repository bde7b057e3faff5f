"""Mixed ranks in one pack: the shared harness of the "packed = solo" checks for members of ranks 1, 8 and 32
(different alphas) in ONE pack, for HF rollouts (the packed step loop) and vLLM multi-LoRA rollouts (one engine,
one ``generate`` call). Used by tests/pack/test_pack_ranks.py (CPU: HF, and vLLM through tests/support/fake_vllm.py); a
real-vLLM test passes its ``vllm`` module as ``api`` and its engine as ``llm``.

HF (lorarl.pack.build / steps):
    cells = mixed_rank_cells(model_dir, method="lora")       # 3 cells, ranks 1/8/32, alphas 2/4/64, seeds 1/2/3
    assert_pack_equals_solo(cells, results_dir, steps=3)    # every member's adapter, metrics and RNG = alone's

vLLM (lorarl.pack.multilora):
    names, dirs = save_mixed_rank_adapters(model_dir, out_dir)          # PEFT folders, non-zero B
    llm = api.LLM(model_dir, **saved_engine_lora_kwargs(names, dirs))  # max_lora_rank = 32, the largest
    assert_multilora_pack_equals_solo(api, llm, names, dirs, prompt_ids, sample_settings)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

MIXED_RANKS = ((1, 2.0), (8, 4.0), (32, 64.0))  # (rank, alpha): scalings alpha/r = 2, 0.5, 2


def mixed_rank_cells(model_dir: str, method: str = "lora", steps: int = 3) -> list[Any]:
    """Three cells of one pack that differ in rank and alpha (and seed, beta, lr, temperature)."""
    from tests.support.pack_steps import cell

    (r1, a1), (r2, a2), (r3, a3) = MIXED_RANKS
    return [cell(model_dir, "r1", 1, method=method, rank=r1, alpha=a1, steps=steps),
            cell(model_dir, "r8", 2, beta=0.05, lr=5e-3, method=method, rank=r2, alpha=a2, steps=steps,
                 temperature=0.7),
            cell(model_dir, "r32", 3, method=method, rank=r3, alpha=a3, steps=steps)]


def _close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


def assert_pack_equals_solo(cells: list[Any], results_dir: str | Path, steps: int = 3, tol: float = 1e-6) -> list[dict]:
    """Train ``cells`` as ONE pack for ``steps`` full steps (HF rollouts), then each alone: every member's trained
    adapter and metrics equal its solo run's to ``tol``, and its sampling and data-order streams are the same.
    Returns the packed metrics rows."""
    from lorarl.pack.build import build_pack
    from tests.support.pack_steps import clean, fake_regimes, trained

    pack = fake_regimes(build_pack(cells, results_dir=results_dir, device="cpu"))
    start = [trained(pack, k) for k in range(len(cells))]
    rows = [pack.loop.step() for _ in range(steps)]
    for k, c in enumerate(cells):
        solo = fake_regimes(build_pack([c], results_dir=results_dir, device="cpu"))
        solo_rows = [solo.loop.step() for _ in range(steps)]
        mine, alone = trained(pack, k), trained(solo, 0)
        assert mine.keys() == alone.keys(), c.id
        for n in mine:
            assert mine[n].shape == alone[n].shape, (c.id, n)
            assert float((mine[n] - alone[n]).abs().max()) <= tol, (c.id, n)
        assert any(not torch.equal(mine[n], start[k][n]) for n in mine), c.id  # it trained
        for i in range(steps):
            p, s = clean(rows[i][c.id]), clean(solo_rows[i][c.id])
            assert p.keys() == s.keys() and all(_close(p[m], s[m], tol) for m in p), (c.id, i)
        m, s = pack.loop.members[k], solo.loop.members[0]
        assert torch.equal(m.sampler.get_state(), s.sampler.get_state()), c.id  # the same samples drawn
        assert m.order.state_dict()["perm"] == s.order.state_dict()["perm"], c.id
    return rows


def save_mixed_rank_adapters(model_dir: str, out_dir: str | Path, seed: int = 1) -> tuple[list[str], list[str]]:
    """PEFT LoRA folders of ranks 1, 8 and 32 (alphas 2, 4, 64) on ``model_dir``, B non-zero (as after training)."""
    from tests.support.multilora import save_adapter

    names = [f"r{r}" for r, _ in MIXED_RANKS]
    dirs = [save_adapter(model_dir, Path(out_dir) / n, seed + k, r=r, alpha=a)
            for k, (n, (r, a)) in enumerate(zip(names, MIXED_RANKS))]
    return names, dirs


def multilora_rollouts(api: Any, llm: Any, names: list[str], dirs: list[str], prompts: list[list[int]], s: Any,
                       generations: int = 2, seed: int = 5, members: list[int] | None = None) -> dict[int, list]:
    """The pack's vLLM rollouts (lorarl.pack.multilora's requests, one ``generate`` call) of ``members`` (all by
    default): member k samples ``prompts`` with its own adapter and a seed stream ``seed + k``. Returns
    {k: [(completion token ids, each token's logprob), ...]}, G rows per prompt."""
    from lorarl.pack.multilora import build_requests, lora_requests

    chosen = list(range(len(names))) if members is None else list(members)
    loras = lora_requests(api, names, dirs)
    req = build_requests(api, loras, [prompts if k in chosen else None for k in range(len(names))],
                         [torch.Generator().manual_seed(seed + k) if k in chosen else None for k in range(len(names))],
                         s, generations)
    params = [api.SamplingParams(n=p.n, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                                 max_tokens=p.max_tokens, seed=p.seed, stop_token_ids=p.stop_token_ids, logprobs=0)
              for p in req.params]  # the sampled token's logprob, to compare the arithmetic, not only the tokens
    outs = llm.generate(req.prompts, params, use_tqdm=False, lora_request=req.loras)
    res: dict[int, list] = {k: [] for k in chosen}
    for o, k in zip(outs, req.owner):
        for c in o.outputs:
            ids = list(c.token_ids)
            res[k].append((ids, [float(d[t].logprob) for t, d in zip(ids, c.logprobs)]))
    return res


def assert_multilora_pack_equals_solo(api: Any, llm: Any, names: list[str], dirs: list[str], prompts: list[list[int]],
                                      s: Any, generations: int = 2, tol: float = 1e-6) -> dict[int, list]:
    """All members in one ``generate`` call = each member alone in its own call on the same engine: the same
    tokens, logprobs to ``tol``. Returns the packed rollouts."""
    packed = multilora_rollouts(api, llm, names, dirs, prompts, s, generations)
    for k in range(len(names)):
        alone = multilora_rollouts(api, llm, names, dirs, prompts, s, generations, members=[k])[k]
        assert len(packed[k]) == len(alone) == len(prompts) * generations, names[k]
        for (pt, plp), (st, slp) in zip(packed[k], alone):
            assert pt == st, names[k]
            assert max((abs(a - b) for a, b in zip(plp, slp)), default=0.0) <= tol, names[k]
    return packed
