"""Rollouts generated in chunks whose samples do not depend on the chunking (``rollout.generation_batch_size``).

Why: the HF engine generates the whole rollout batch at once, so its KV cache grows with the batch
(128 x 17k tokens on a 1.5B model is ~60 GB). Generating ``generation_batch_size`` rows at a time bounds
it by the chunk; the samples must not change with it.

How the samples stay the same: HF's ``generate`` draws every row's token from ONE global RNG stream
(``torch.multinomial`` over the batch), so which random number a row gets depends on the batch it is
in. Here each generation call first draws a table of uniforms, one row per sequence and one column per
decode step (``U_NT``, drawn ONCE for the whole call, so the stream is consumed the same way whatever the
chunking), and row ``i`` takes its step-``t`` token by inverse-CDF sampling at ``U_NT[i, t]`` from its own
sampling distribution. Rows never interact (causal attention, per-row matmuls), every chunk is
left-padded to the call's widest prompt (each decode step sees the same key length in every chunking),
so a chunk of 1, 3 or the whole batch samples the same tokens (bit for bit on the CPU: tests/train/test_rowsample.py;
on a GPU a different batch shape may pick another matmul kernel, whose last-bit differences move a sample
only when a uniform falls on a CDF boundary).

* Solo trainer (:class:`ChunkedRollouts`, a mixin of ``LorarlGRPOTrainer``): TRL's HF ``generate`` path
  with a final logits processor (:class:`RowSampler`) that applies the sampling warpers (temperature,
  top-k, top-p, min-p, in HF's order, after HF's other processors such as a repetition penalty) and
  returns a one-hot score for the drawn token, which ``generate`` (``do_sample=False``) takes. ``U_NT``
  comes from the cell's own sampling generator (:func:`lorarl.train.streams.sampling_generator`), whose state
  the trainer saves and restores with its checkpoints' RNG states (a resumed run samples what the
  uninterrupted run samples: tests/train/test_resume.py).
* KV cache and compiled decode step (``runtime.generation``, :mod:`lorarl.decoding`): set on the chunk's
  generation config (``cache_implementation="static"``, ``compile_config``); ``generate``'s logits processors,
  :class:`RowSampler` included, run as before, so ``U_NT`` is consumed identically (tests/train/test_rowsample.py).
* Several ranks (lorarl.train.ranks): every rank draws the table for the rows of every rank from its copy of
  the generator and takes its rows (row ``i`` of the generation batch gets row ``i`` of the table:
  :func:`batch_uniforms`), prompts padded to the widest over the ranks, so the samples do not depend on the
  number of ranks either.
* Packed trainer (:mod:`lorarl.pack.generate`): the same table, drawn from the same per-cell generator, so a
  cell samples the same tokens in a solo job and in a pack (docs/packed.md, "One cell, one result").
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def chunk_slices(n: int, size: int | str | None) -> list[slice]:
    """Row ranges of ``n`` rows taken ``size`` at a time (None, "auto" unresolved or >= n: one chunk)."""
    if not isinstance(size, int) or size >= n:
        return [slice(0, n)]
    if size < 1:
        raise ValueError(f"rollout.generation_batch_size must be a positive number of sequences, 'auto' or null; got {size}")
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def draw_uniforms(rows: int, steps: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``U_NT``: one uniform per row and decode step, float64 on the CPU (the stream is the same on any device)."""
    return torch.rand((rows, steps), generator=generator, dtype=torch.float64)


def inverse_cdf(probs_BV: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """Token of each row: the first index whose cumulative probability exceeds ``u * total`` (an exact
    categorical draw; a token of probability 0 is never taken)."""
    cdf_BV = probs_BV.double().cumsum(-1)
    v_B1 = u_B.to(cdf_BV).unsqueeze(1) * cdf_BV[:, -1:]
    tok_B = torch.searchsorted(cdf_BV, v_B1.contiguous(), right=True).squeeze(1)
    V = probs_BV.size(-1)
    last_B = V - 1 - (probs_BV > 0).flip(-1).int().argmax(-1)  # rounding at u ~ 1: the last possible token
    return torch.minimum(tok_B, last_B)


_UNSUPPORTED = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}


def sampling_warpers(cfg: Any) -> list:
    """HF's sampling warpers of a generation config, in HF's order (``_get_logits_processor``)."""
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    for name, neutral in _UNSUPPORTED.items():
        value = getattr(cfg, name, None)
        if value is not None and value != neutral:
            raise ValueError(f"generation setting {name}={value!r} is not supported by lorarl's HF rollouts; "
                             "allowed sampling settings: temperature, top_k, top_p, min_p")
    out = []
    if cfg.temperature is not None and cfg.temperature != 1.0:
        out.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k is not None and cfg.top_k != 0:
        out.append(TopKLogitsWarper(top_k=cfg.top_k, min_tokens_to_keep=1))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=cfg.top_p, min_tokens_to_keep=1))
    if cfg.min_p is not None:
        out.append(MinPLogitsWarper(min_p=cfg.min_p, min_tokens_to_keep=1))
    return out


def batch_uniforms(accelerator: Any, rows: int, steps: int, generator: torch.Generator) -> torch.Tensor:
    """This rank's rows of ``U_NT``, drawn from the cell's sampling generator (lorarl.train.streams). Several ranks:
    every rank holds the same generator (seeded by the cell's seed, advanced by the same draws), draws the table of
    the whole generation batch and takes its rows, so row ``i`` gets row ``i`` of the one-process table."""
    if accelerator.num_processes == 1:
        return draw_uniforms(rows, steps, generator)
    from lorarl.train.ranks import row_slice

    total, mine = row_slice(accelerator, rows)
    return draw_uniforms(total, steps, generator)[mine]


class RowSampler:
    """Last logits processor of a chunk's ``generate``: warp, then draw row ``i``'s step-``t`` token at
    ``u_NT[i, t]``; returns scores that are 0 at the drawn token and -inf elsewhere (argmax takes it)."""

    def __init__(self, u_NT: torch.Tensor, prompt_width: int, warpers: list):
        self.u_NT, self.width, self.warpers = u_NT, prompt_width, warpers

    def __call__(self, input_ids: torch.Tensor, scores_BV: torch.Tensor) -> torch.Tensor:
        t = input_ids.size(1) - self.width
        for w in self.warpers:
            scores_BV = w(input_ids, scores_BV)
        tok_B = inverse_cdf(scores_BV.float().softmax(-1), self.u_NT[:, t])
        out_BV = torch.full_like(scores_BV, float("-inf"))
        return out_BV.scatter_(1, tok_B.unsqueeze(1), 0.0)


def left_pad(prompts: list[list[int]], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded to ``width`` columns: ids and attention mask."""
    ids_NP = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask_NP = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p) > width:
            raise ValueError(f"prompt of {len(p)} tokens is wider than the rollout's prompt width {width}")
        if p:
            ids_NP[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask_NP[i, width - len(p):] = 1
    return ids_NP, mask_NP


class ChunkedRollouts:
    """Mixin of ``LorarlGRPOTrainer``: TRL's HF generation path, ``generation_batch_size`` rows at a time
    and chunk-invariant sampling (see the module docstring). vLLM, transformers' continuous batching and
    multimodal prompts keep TRL's own path."""

    generation_batch_size: int | str | None = None  # rows generated at once; None = the whole batch
    generation_engine: Any = None  # runtime.generation (lorarl.decoding): KV cache and compiled decode step

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.use_vllm or self.use_transformers_continuous_batching or multimodal_fields or \
                (images is not None and any(im is not None for im in images)):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        return self._chunked_generate([list(map(int, p)) for p in prompt_ids]), None

    def _chunked_generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        from trl.models import unwrap_model_for_generation

        from lorarl.decoding import apply, plan
        from lorarl.train.ranks import global_max

        dev, pad = self.accelerator.device, self._tokenizer.pad_token_id
        width = global_max(self.accelerator, max(len(p) for p in prompt_ids))  # over every rank (lorarl.train.ranks)
        width = max(width, getattr(self, "prompt_width", None) or 0)  # the cell's fixed width (the pack's)
        m = self.pad_to_multiple_of
        width = -(-width // m) * m if m else width
        steps = int(self.generation_config.max_new_tokens)
        u_NT = batch_uniforms(self.accelerator, len(prompt_ids), steps, self.sample_generator)  # the whole call's stream, before any chunk
        eos_E = torch.tensor(self.eos_token_ids, device=dev)
        out: list[list[int]] = []
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                         generation_kwargs=self.generation_kwargs,
                                         gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs
                                         ) as model, torch.no_grad(), self._dist.summon_full_params(
                                             self.model_wrapped, recurse=False):
            cfg, _ = model._prepare_generation_config(copy.deepcopy(self.generation_config))
            warpers = sampling_warpers(cfg)  # what HF would apply with do_sample=True
            greedy = copy.deepcopy(self.generation_config)  # TRL's, with HF's sampling handed to RowSampler
            greedy.do_sample, greedy.temperature, greedy.top_k, greedy.top_p, greedy.min_p = False, 1.0, None, 1.0, None
            apply(greedy, plan(self.generation_engine, model, dev.type), dev.type)  # static cache + compile, or not
            for sl in chunk_slices(len(prompt_ids), self.generation_batch_size):
                ids_NP, mask_NP = left_pad(prompt_ids[sl], width, pad)
                seq_NL = model.generate(input_ids=ids_NP.to(dev), attention_mask=mask_NP.to(dev),
                                        generation_config=greedy, logits_processor=[RowSampler(u_NT[sl].to(dev), width, warpers)])
                comp_NT = seq_NL[:, width:]
                is_eos_NT = torch.isin(comp_NT, eos_E)  # TRL's rule: keep up to and including the first EOS
                first_N = torch.where(is_eos_NT.any(1), is_eos_NT.int().argmax(1), comp_NT.size(1))
                out += [c[: int(n) + 1].tolist() for c, n in zip(comp_NT.cpu(), first_N.cpu())]
        return out
