"""Batched rollouts of a pack: one generation over every member's prompts, each row through its own
cell's adapter (:class:`lorarl.pack.routing.Router`), each cell sampling from ITS OWN ``torch.Generator``.

    rows = generate(router, [prompts_0, prompts_1, ...], [gen_0, gen_1, ...], settings)

Why a sampler of its own (not ``model.generate``): HF's ``generate`` draws from the global RNG, so the
cells of a pack would share one stream and a cell's samples would depend on its pack-mates. Here each
cell first draws from ITS OWN generator a table of uniforms (its rows x ``max_new_tokens``; the same
amount whatever the pack and the chunking), each decode step runs ONE forward over the chunk's rows (KV
cache), then each row takes its next token by inverse-CDF sampling at its own uniform
(:mod:`lorarl.train.rowsample`), so a cell's samples depend neither on who else is in the pack nor on
``generation_batch_size`` (rows generated at once: the KV cache is bounded by the chunk).

Bit-for-bit contract (tests/pack/test_pack_steps.py): the prompt width is a fixed number of columns
(``settings.prompt_width``: the longest training prompt of the task, the same for every member and for a
pack of one, and for every chunk), so every decode step sees the same key length in a pack of K, in a pack
of one and in any chunk; rows never interact (causal attention, per-row matmuls), so a pack of K samples
exactly what K packs of one sample, in chunks of any size (tests/train/test_rowsample.py). Sampling: logits / temperature, then nucleus (top-p) filtering as HF's ``TopPLogitsWarper``
(no top-k: TRL's default ``top_k=0``).

``runtime.batch_invariant`` (``settings.batch_invariant``, :mod:`lorarl.numerics.invariant`): each cell's rows are
decoded apart, in the chunks of its pack of one, so no decode step's kernels see a pack-mate's rows (a GPU's kernels
depend on the batch's shape).

KV cache (``runtime.generation``, :mod:`lorarl.decoding`): transformers' dynamic cache, or a static cache of
``prompt_width + max_new_tokens`` positions (fixed shapes); the decode loop stays eager (the routing's row blocks
are Python state), and the uniforms are consumed as with the dynamic cache (tests/train/test_rowsample.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lorarl.decoding import GenerationEngine, new_cache, plan
from lorarl.train.rowsample import chunk_slices, draw_uniforms, inverse_cdf, left_pad


@dataclass(frozen=True)
class SampleSettings:
    """Sampling settings of a pack: shapes shared (in the compatibility key), temperature and top-p per cell."""

    prompt_width: int  # why: fixed left-padded prompt columns (bit-equal packs of any size)
    max_new_tokens: int  # why: train.max_completion_length
    temperature: float | tuple[float, ...] = 1.0  # why: train.temperature (one for all, or one per cell)
    top_p: float | tuple[float, ...] = 1.0  # why: train.top_p (one for all, or one per cell)
    pad_token_id: int = 0  # why: filler after a row's end (and left padding)
    eos_token_ids: tuple[int, ...] = ()  # why: a row ends at the first of these (kept, TRL's convention)
    generation_batch_size: int | None = None  # why: rows generated at once (KV-cache memory; samples unchanged)
    engine: GenerationEngine | None = None  # why: runtime.generation, the KV cache (static or dynamic; lorarl.decoding)
    batch_invariant: bool = False  # why: runtime.batch_invariant, each cell's rows decoded apart (chunks of its own)

    def cell(self, k: int) -> tuple[float, float]:
        """(temperature, top_p) of cell k."""
        t = self.temperature[k] if isinstance(self.temperature, tuple) else self.temperature
        p = self.top_p[k] if isinstance(self.top_p, tuple) else self.top_p
        return float(t), float(p)


@dataclass
class CellRollouts:
    """One cell's sampled rows: unpadded prompt and completion ids (EOS included when emitted)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None = None  # why: the sampler's logprob of each sampled token (vLLM), else None


def next_token_probs(logits_BV: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Sampling distribution of the next token: softmax(logits / T), nucleus-filtered (HF's rule: keep
    the smallest set of tokens whose mass reaches ``top_p``, always the most likely one)."""
    scores_BV = logits_BV.float() / temperature
    if top_p < 1.0:
        sorted_BV, idx_BV = torch.sort(scores_BV, descending=False)
        cum_BV = sorted_BV.softmax(-1).cumsum(-1)
        remove_BV = cum_BV <= (1 - top_p)
        remove_BV[:, -1] = False
        scores_BV = scores_BV.masked_fill(remove_BV.scatter(1, idx_BV, remove_BV), float("-inf"))
    return scores_BV.softmax(-1)


@torch.no_grad()
def generate(router, prompts: list[list[list[int]] | None], generators: list[torch.Generator | None],
             s: SampleSettings) -> list[CellRollouts | None]:
    """Sample one completion per prompt row for every cell whose ``prompts[k]`` is not None (the cells
    left out keep zero rows and draw nothing). Rows of a prompt group are passed repeated (G copies).
    Each cell first draws its uniform table ``U`` (rows x max_new_tokens) from its own generator, then
    the rows are generated ``s.generation_batch_size`` at a time (None: all at once)."""
    idx = [k for k, p in enumerate(prompts) if p is not None]
    if s.batch_invariant and len(idx) > 1:  # each cell decoded apart, in the chunks of its pack of one
        return [generate(router, [p if j == k else None for j, p in enumerate(prompts)], generators, s)[k]
                if k in idx else None for k in range(len(prompts))]
    cell_N = [k for k in idx for _ in prompts[k]]
    flat = [row for k in idx for row in prompts[k]]
    if not flat:
        return [None] * len(prompts)
    u_NT = torch.cat([draw_uniforms(len(prompts[k]), s.max_new_tokens, generators[k]) for k in idx])
    host = router.host
    was_training = host.training
    host.eval()
    comps: list[list[int]] = []
    try:
        for sl in chunk_slices(len(flat), s.generation_batch_size):
            cells = cell_N[sl]
            sizes = [cells.count(k) for k in range(len(prompts))]
            comps += _decode(router, flat[sl], cells, u_NT[sl], sizes, s)
    finally:
        host.train(was_training)
    res: list[CellRollouts | None] = [None] * len(prompts)
    start = 0
    for k in idx:
        n = len(prompts[k])
        res[k] = CellRollouts(prompt_ids=[list(p) for p in prompts[k]], completion_ids=comps[start:start + n])
        start += n
    return res


def _decode(router, rows: list[list[int]], cell_N: list[int], u_NT: torch.Tensor, sizes: list[int],
            s: SampleSettings) -> list[list[int]]:
    """One chunk: prefill, then one forward per decode step over the chunk's rows (KV cache); row ``i``
    of cell ``k`` draws its step-``t`` token at ``u_NT[i, t]`` under cell k's temperature and top-p."""
    host = router.host
    dev = next(host.parameters()).device
    ids_NP, mask_NP = left_pad(rows, s.prompt_width, s.pad_token_id)
    ids_NP, mask_NP = ids_NP.to(dev), mask_NP.to(dev)
    pos_NP = (mask_NP.cumsum(-1) - 1).clamp(min=0)
    N = ids_NP.size(0)
    eos = torch.tensor(sorted(set(s.eos_token_ids)) or [-1], device=dev)
    done_N = torch.zeros(N, dtype=torch.bool, device=dev)
    out_NT = torch.full((N, s.max_new_tokens), s.pad_token_id, dtype=torch.long, device=dev)
    length_N = torch.zeros(N, dtype=torch.long, device=dev)
    spans = {}
    for k in dict.fromkeys(cell_N):
        first = cell_N.index(k)
        spans[k] = slice(first, first + cell_N.count(k))
    cache = new_cache(host, plan(s.engine, host, dev.type, routed=True), s.prompt_width + s.max_new_tokens)
    attn_NL, next_pos_N = mask_NP, pos_NP[:, -1] + 1
    with router.route(sizes):
        logits = host(input_ids=ids_NP, attention_mask=attn_NL, position_ids=pos_NP, past_key_values=cache,
                      use_cache=True, logits_to_keep=1).logits[:, -1]
        for t in range(s.max_new_tokens):
            tok_N = torch.full((N,), s.pad_token_id, dtype=torch.long, device=dev)
            for k, sl in spans.items():
                if bool(done_N[sl].all()):
                    continue  # this cell's rows are finished in this chunk: nothing to draw
                draw_B = inverse_cdf(next_token_probs(logits[sl], *s.cell(k)), u_NT[sl, t].to(dev))
                tok_N[sl] = torch.where(done_N[sl], torch.full_like(draw_B, s.pad_token_id), draw_B)
            live_N = ~done_N
            out_NT[:, t] = tok_N
            length_N += live_N.long()
            done_N = done_N | (live_N & torch.isin(tok_N, eos))
            if bool(done_N.all()) or t + 1 == s.max_new_tokens:
                break
            attn_NL = torch.cat([attn_NL, torch.ones((N, 1), dtype=attn_NL.dtype, device=dev)], dim=1)
            logits = host(input_ids=tok_N.unsqueeze(1), attention_mask=attn_NL,
                          position_ids=next_pos_N.unsqueeze(1), past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos_N = next_pos_N + 1
    out_NT, length_N = out_NT.cpu(), length_N.cpu()
    return [out_NT[i, : int(length_N[i])].tolist() for i in range(N)]
