"""Full GRPO steps of a pack: data order, batched rollouts, regime scoring, advantages, KL, update.

    loop = PackLoop(trainer, members, sample_settings, tokenizer, ref_model)
    rows = loop.step()            # {cell name: metrics row} for the cells that took this step

One step, for every member still running and below its ``steps``:
1. the member draws its P prompts from ITS OWN data order (:class:`lorarl.train.streams.DataOrder`: a
   permutation per epoch from its own ``torch.Generator`` seeded by the cell's seed; the solo job's TRL sampler
   yields the same order);
2. one batched generation over all members' rows (:func:`lorarl.pack.generate.generate`, each cell
   sampling from its own generator), or with ``rollout.engine: vllm`` every member's current adapter handed to
   the pack's engine and ONE multi-LoRA ``generate`` call (:class:`lorarl.pack.vllm_rollouts.VLLMRollouts`);
3. per member: its regime's reward deposits (:mod:`lorarl.rewards`: outcome, process, distillation),
   DAPO's overlong penalty, ``[B, T]`` advantages (:func:`lorarl.train.advantages.advantages_from_deposits`),
   the metrics the solo trainer logs (accuracy, frac_boxed, deposits, adv/*);
4. one reference forward over the rows of the members with ``beta > 0`` (the shared frozen base);
5. the packed update (:class:`lorarl.pack.trainer.PackedTrainer`);
6. every ``kl_monitor_every`` steps, the no-grad KL monitors (KL to the base, KL(new || old)).

Every tensor of a step has fixed widths (prompt columns = the task's longest prompt, completion
columns = ``max_completion_length``), so a member's arithmetic does not depend on its pack-mates:
a pack of K equals K packs of one, bit for bit on the CPU (tests/pack/test_pack_steps.py). With
``runtime.batch_invariant`` (:mod:`lorarl.numerics.invariant`) every rollout, forward and backward holds one member's
rows, in its pack-of-one shapes, for a GPU whose kernels depend on the batch's shape.

Scope: one optimiser step per rollout batch (``num_iterations = 1``, no mini-batches) and no DAPO
dynamic sampling; :func:`lorarl.pack.plan.pack_key` keeps cells with those settings solo.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from lorarl import ledger
from lorarl.numerics import kl as klmod
from lorarl.train.advantages import advantages_from_deposits
from lorarl.pack.generate import SampleSettings, generate
from lorarl.pack.rowstats import rollout_stats
from lorarl.pack.tiled import cell_logps, tiled_logps
from lorarl.pack.trainer import PackedTrainer
from lorarl.pack.vllm_rollouts import logp_gap
from lorarl.train.streams import DataOrder
from lorarl.train.tokenbudget import forward_rows
from lorarl.rewards import Rollouts, decode_tokens, overlong_penalty


@dataclass
class Member:
    """What the step loop needs of one cell besides its PackCell (same index in the trainer)."""

    name: str  # why: the cell id (metrics rows are keyed by it)
    regime: Any  # why: the cell's reward regime (lorarl.rewards.registry.build_regime)
    prompts: list[str]  # why: prompt texts of the training set (what a PRM reads)
    prompt_ids: list[list[int]]  # why: their token ids (unpadded)
    answers: list[str]  # why: gold answers (only the outcome regime reads them)
    order: DataOrder  # why: the cell's own data order
    sampler: torch.Generator  # why: the cell's own sampling stream
    steps: int  # why: train.steps (the member stops there)
    prompts_per_step: int  # why: P
    generations: int  # why: G (group size)
    beta: float = 0.0  # why: KL coefficient (reference forward only when > 0)
    scale_rewards: bool = True  # why: divide by the group std (Dr. GRPO: False)
    kl_monitor_every: int = 0  # why: no-grad KL monitors every N steps (0 = never)
    overlong_buffer: int = 0  # why: DAPO soft overlong penalty ramp (0 = off)
    overlong_factor: float = 1.0  # why: DAPO penalty at the length limit
    step: int = 0  # why: optimiser steps this cell has taken (resume: restored)
    adv_std_peak: float = 0.0  # why: running peak of adv/std (the collapse flag reads it)
    tokens_seen: float = 0.0  # why: prompt + completion tokens trained on so far (TRL's num_tokens; resume: restored)
    grading: Any = None  # why: answer format + math-verify settings of the accuracy metric (reward.*)
    extra: dict = field(default_factory=dict)  # why: per-cell state the runner keeps (checkpoint, recorder)


def _runs(rows: list[tuple[slice, float]]) -> list[tuple[slice, float]]:
    """Consecutive one-row slices of one temperature merged (one head call per cell's run of rows)."""
    out: list[tuple[slice, float]] = []
    for sl, t in rows:
        if out and out[-1][1] == t and out[-1][0].stop == sl.start:
            out[-1] = (slice(out[-1][0].start, sl.stop), t)
        else:
            out.append((sl, t))
    return out


def _text(ids: list[int], tok: Any) -> str:
    return tok.decode(ids, skip_special_tokens=True)


class PackLoop:
    """Runs full GRPO steps for the members of one PackedTrainer."""

    def __init__(self, trainer: PackedTrainer, members: list[Member], sample: SampleSettings, tokenizer: Any,
                 ref_model: Any = None, rollouts: Any = None):
        if len(members) != len(trainer.cells):
            raise ValueError(f"{len(members)} members for {len(trainer.cells)} cells")
        self.trainer, self.members, self.sample, self.tok, self.ref = trainer, members, sample, tokenizer, ref_model
        self.rollouts = rollouts  # None: HF rollouts (generate); else lorarl.pack.vllm_rollouts.VLLMRollouts
        if ref_model is None and any(m.beta > 0 or m.kl_monitor_every for m in members):
            raise ValueError("beta > 0 or kl_monitor_every > 0 needs the frozen reference model")
        self.eos = set(sample.eos_token_ids) | {sample.pad_token_id}
        self.last_rollouts: dict[str, list[list[int]]] = {}  # cell name -> completion token ids of the last step

    def active(self) -> list[int]:
        return [k for k in self.trainer.running() if self.members[k].step < self.members[k].steps]

    # ------------------------------------------------------------------ pieces
    def _batch(self, k: int, ro: Any, adv_BT: torch.Tensor) -> dict:
        W, T, pad = self.sample.prompt_width, self.sample.max_new_tokens, self.sample.pad_token_id
        B = len(ro.completion_ids)
        b = {"prompt_ids": torch.full((B, W), pad, dtype=torch.long), "prompt_mask": torch.zeros(B, W, dtype=torch.long),
             "completion_ids": torch.full((B, T), pad, dtype=torch.long),
             "completion_mask": torch.zeros(B, T, dtype=torch.long), "advantages": adv_BT}
        for i, (p, c) in enumerate(zip(ro.prompt_ids, ro.completion_ids)):
            b["prompt_ids"][i, W - len(p):] = torch.tensor(p, dtype=torch.long)
            b["prompt_mask"][i, W - len(p):] = 1
            if c:
                b["completion_ids"][i, :len(c)] = torch.tensor(c, dtype=torch.long)
                b["completion_mask"][i, :len(c)] = 1
        dev = next(self.trainer.host.parameters()).device
        return {key: v.to(dev) for key, v in b.items()}

    def _ref_logps(self, batches: dict[int, dict]) -> dict[int, torch.Tensor]:
        """Log-probs of each listed cell's completions under the frozen base: one forward, no routing."""
        if not batches:
            return {}
        if self.trainer.batch_invariant and len(batches) > 1:  # one cell per forward: its own batch shapes
            return {k: self._ref_logps({k: b})[k] for k, b in batches.items()}
        T = self.sample.max_new_tokens
        ids = torch.cat([torch.cat([b["prompt_ids"], b["completion_ids"]], 1) for b in batches.values()])
        attn = torch.cat([torch.cat([b["prompt_mask"], b["completion_mask"]], 1) for b in batches.values()])
        W = self.sample.prompt_width
        pos = torch.arange(W + T, device=ids.device).unsqueeze(0).expand(ids.size(0), -1)
        temp = torch.cat([torch.full((b["prompt_ids"].size(0),), self.sample.cell(k)[0], device=ids.device)
                          for k, b in batches.items()])[:, None, None]  # each cell's temperature
        per_cell = forward_rows(self.trainer.micro_batch_tokens, ids.size(1)) if self.trainer.micro_batch_tokens \
            else self.trainer.micro_batch_size  # rows per forward of each cell: its micro-batch or token budget
        R = (per_cell or ids.size(0)) * len(batches)
        parts = []
        with torch.no_grad():
            for lo in range(0, ids.size(0), R):
                sl = slice(lo, lo + R)
                got = None
                if self.trainer.trl_head:  # the solo job's head (TRL's fused kernel), each cell at its temperature
                    rows = [(slice(i - lo, i - lo + 1), float(temp[i])) for i in range(lo, min(lo + R, ids.size(0)))]
                    got = cell_logps(self.ref, ids[sl], attn[sl], pos[sl], T, _runs(rows))
                if got is None:
                    got = tiled_logps(self.ref, ids[sl], attn[sl], pos[sl], T, temp[sl], self.trainer.logit_tokens)
                if got is None:
                    logits = self.ref(input_ids=ids[sl], attention_mask=attn[sl], position_ids=pos[sl]).logits[:, -T - 1:-1]
                    logits = logits.float() / temp[sl]
                    got = torch.log_softmax(logits, -1).gather(-1, ids[sl, -T:].unsqueeze(-1)).squeeze(-1)
                parts.append(got)
        lp = torch.cat(parts)
        out, start = {}, 0
        for k, b in batches.items():
            n = b["prompt_ids"].size(0)
            out[k] = lp[start:start + n]
            start += n
        return out

    def _policy_logps(self, batches: dict[int, dict]) -> dict[int, torch.Tensor]:
        if not batches:
            return {}
        full = [batches.get(k) for k in range(len(self.members))]
        idx = list(batches)
        with torch.no_grad():
            return dict(zip(idx, self.trainer.logps_chunked(full, idx)))

    def _score(self, k: int, ro: Any, student_logps: list[list[float]] | None) -> tuple[torch.Tensor, dict]:
        """Deposits → ``[B, T]`` advantages and the scoring metrics of one cell (as LorarlGRPOTrainer)."""
        from lorarl.grading.verify import extract_boxed
        from lorarl.grading.answer_formats import has_answer

        m = self.members[k]
        texts = [_text(c, self.tok) for c in ro.completion_ids]
        rows = m.extra["rows_idx"]
        answers = [m.answers[i] for i in rows]
        rollouts = Rollouts(prompts=[m.prompts[i] for i in rows], completions=texts, prompt_ids=ro.prompt_ids,
                            completion_ids=ro.completion_ids, token_texts=decode_tokens(self.tok, ro.completion_ids),
                            answers=answers if m.regime.needs_gold else None, student_logps=student_logps)
        dep = m.regime.deposits(rollouts)
        if len(dep) != len(texts):
            raise ValueError(f"regime {m.regime.name} returned {len(dep)} deposit lists for {len(texts)} completions")
        if m.regime.reports_accuracy:
            accuracy = list(getattr(m.regime, "last_correct", None) or [v[0] for v in dep.values])
        else:
            from lorarl.rewards.outcome import grade

            accuracy = grade(texts, answers, settings=m.grading)  # monitoring only
        penalized = 0
        for i, ids in enumerate(ro.completion_ids):
            pen = overlong_penalty(len(ids), self.sample.max_new_tokens, m.overlong_buffer, m.overlong_factor)
            if pen:
                dep.add(i, max(len(ids) - 1, 0), pen)
                penalized += 1
        n, T = len(texts), self.sample.max_new_tokens
        lengths = torch.tensor([len(c) for c in ro.completion_ids])
        valid_BT = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
        row_D, pos_D, val_D = dep.flat()
        adv = advantages_from_deposits(row_D, pos_D, val_D, valid_BT, m.generations, dense=dep.dense,
                                       scale=m.scale_rewards)
        totals = torch.tensor(dep.totals, dtype=torch.float32)
        all_vals = [v for vals in dep.values for v in vals]
        met = {"reward": float(totals.mean()), "reward_std": float(totals.std()) if n > 1 else 0.0,
               "accuracy": sum(accuracy) / n, "frac_boxed": sum(extract_boxed(t) is not None for t in texts) / n,
               "frac_answered": sum(has_answer(getattr(m.grading, "answer_format", "boxed"), t) for t in texts) / n,
               "frac_truncated": sum(bool(ids) and ids[-1] not in self.eos for ids in ro.completion_ids) / n,
               "completions/mean_length": float(lengths.float().mean()),
               "deposits/per_completion": sum(dep.counts) / n,
               "deposits/mean": sum(all_vals) / max(len(all_vals), 1)}
        if m.overlong_buffer:
            met["overlong/frac_penalized"] = penalized / n
        for term, values in (getattr(m.regime, "last_terms", None) or {}).items():  # reward.terms, unweighted
            met[f"reward_terms/{term}"] = sum(values) / n
        met.update(rollout_stats(ro.completion_ids, self.eos, dep.totals, m.generations, m.regime.name))
        met["rollout/degenerate_rate"] = float(adv.stats.degenerate_P.float().mean())
        vals = adv.adv_BT[valid_BT]
        if vals.numel():
            std = vals.std().item() if vals.numel() > 1 else 0.0
            m.adv_std_peak = max(m.adv_std_peak, std)
            met.update({"adv/std": std, "adv/std_peak": m.adv_std_peak, "adv/abs_max": vals.abs().max().item()})
        return adv.adv_BT, met

    # ------------------------------------------------------------------ one step
    def step(self) -> dict[str, dict[str, float]]:
        t0 = time.perf_counter()
        idx = self.active()
        if not idx:
            return {}
        ledger.step_begin()  # the cost ledger's step window (lorarl.ledger)
        prompts: list[list[list[int]] | None] = [None] * len(self.members)
        for k in idx:
            m = self.members[k]
            rows = m.order.take(m.prompts_per_step)
            m.extra["rows_idx"] = [i for i in rows for _ in range(m.generations)]
            prompts[k] = [m.prompt_ids[i] for i in m.extra["rows_idx"]]
        t_gen, pushed = time.perf_counter(), ledger.total("handoff")
        gens = [self.members[k].sampler if prompts[k] is not None else None for k in range(len(self.members))]
        if self.rollouts is None:
            ros = generate(self.trainer.router, prompts, gens, self.sample)
        else:  # vLLM: each member's adapter handed over once, then one call; each prompt once, n = G
            with ledger.phase("handoff"):  # the members' adapters into the engine, apart from generation
                self.rollouts.handover()
            groups = [None if p is None else p[::self.members[k].generations] for k, p in enumerate(prompts)]
            ros = self.rollouts(groups, gens, self.members[idx[0]].generations)
        t_gen = time.perf_counter() - t_gen
        ledger.spent("generation", t_gen - (ledger.total("handoff") - pushed))
        self.last_rollouts = {self.members[k].name: ros[k].completion_ids for k in idx}  # this step's token ids
        t_score = time.perf_counter()
        pre = {k: self._batch(k, ros[k], torch.zeros(len(ros[k].completion_ids), self.sample.max_new_tokens))
               for k in idx}
        need_student = {k: pre[k] for k in idx if self.members[k].regime.needs_student_logps}
        student = self._policy_logps(need_student)
        batches: list[dict | None] = [None] * len(self.members)
        metrics: dict[int, dict] = {}
        own_s: dict[int, float] = {}  # each member's own scoring time (the rest of the step is shared)
        for k in idx:
            t_k = time.perf_counter()
            sl = None
            if k in student:
                sl = [student[k][i, :len(c)].tolist() for i, c in enumerate(ros[k].completion_ids)]
            adv_BT, met = self._score(k, ros[k], sl)
            b = pre[k]
            b["advantages"] = adv_BT.to(b["prompt_ids"].device)
            batches[k], metrics[k] = b, met
            own_s[k] = time.perf_counter() - t_k
            met["time/reward_s"] = own_s[k]
        t_score = time.perf_counter() - t_score
        ledger.spent("reward", t_score)  # rewards, grading and the students' log-probs they need
        t_ref = time.perf_counter()
        ref = self._ref_logps({k: batches[k] for k in idx if self.members[k].beta > 0})
        for k, lp in ref.items():
            batches[k]["lorarl_ref_logps"] = lp
        t_ref = time.perf_counter() - t_ref
        ledger.spent("reference", t_ref)
        lrs = {k: self.trainer.cells[k].optimizer.param_groups[0]["lr"] for k in idx}  # the lr of this update
        upd = self.trainer.step(batches)
        wall = time.perf_counter() - t0
        out: dict[str, dict[str, float]] = {}
        ledger.close_step(wall)  # the rest of the step: the update (lorarl.ledger)
        # A member's step time: its own scoring + the shared work (generate, forwards, update) apportioned by
        # its share of the step's completion tokens; the members' times add up to the pack's wall time.
        toks = {k: float(batches[k]["completion_mask"].sum()) for k in idx}
        shared = max(wall - sum(own_s.values()), 0.0)
        cell_s = {k: own_s[k] + shared * (toks[k] / sum(toks.values()) if sum(toks.values()) else 1 / len(idx))
                  for k in idx}
        monitor = [k for k in idx if self.members[k].kl_monitor_every
                   and (self.members[k].step + 1) % self.members[k].kl_monitor_every == 0]
        for k in idx:
            m, c = self.members[k], self.trainer.cells[k]
            m.step += 1
            u = upd.get(c.name, {})
            if c.state == "diverged" and c.diverged_at is not None:
                c.diverged_at = m.step
            tokens = float(batches[k]["completion_mask"].sum())
            ledger.count_tokens(m.name, tokens)  # the key that splits the pack's time among its members
            m.tokens_seen += tokens + float(batches[k]["prompt_mask"].sum())  # TRL's num_tokens
            row = {"loss": u.get("loss", float("nan")), "grad_norm": u.get("grad_norm", float("nan")),
                   "learning_rate": float(lrs[k]), **metrics[k], "time/step_s": cell_s[k], "pack/step_s": wall, "time/generate_s": t_gen, "time/score_s": t_score + t_gen,
                   "time/ref_forward_s": t_ref, "rollout/tokens": tokens, "tokens_per_s": tokens / cell_s[k] if cell_s[k] else 0.0,
                   "pack/cells": float(len(idx)), "step_time": cell_s[k], "num_tokens": m.tokens_seen}
            row.update({n: v for n, v in u.items() if n not in row and n != "diverged"})  # ppo_kl, entropy, clip_ratio/*, kl
            if ros[k].logprobs is not None and k in self.trainer.last_logps:  # vLLM: sampler vs trainer
                row.update(logp_gap(ros[k].logprobs, self.trainer.last_logps[k]))
            if m.beta > 0 and k in ref and k in self.trainer.last_logps:
                self._kl_ref_metrics(row, k, batches[k], ref[k], self.trainer.last_logps[k])
            out[m.name] = row
        if monitor:
            self._monitors(monitor, batches, ref, out)
        return out

    # ------------------------------------------------------------------ monitors
    def _kl_ref_metrics(self, row: dict, k: int, b: dict, ref_BT: torch.Tensor, upd_logps: Any) -> None:
        """kl_ref/* of the policy that produced the rows (old log-probs are the pre-update policy's)."""
        if upd_logps is None:
            return
        mask = b["completion_mask"]
        row["kl_ref/k1"] = klmod.masked_mean(klmod.k1(upd_logps, ref_BT), mask).item()
        row["kl_ref/k3"] = klmod.masked_mean(klmod.k3(upd_logps, ref_BT), mask).item()
        row["kl_ref/one_sided"] = klmod.masked_mean(klmod.one_sided(upd_logps, ref_BT), mask).item()
        m = self.members[k]
        if m.beta > 0:
            row["kl_ref/penalty"] = m.beta * klmod.masked_mean(klmod.k3(upd_logps, ref_BT), mask).item()

    def _monitors(self, idx: list[int], batches: list, ref: dict, out: dict) -> None:
        """No-grad monitors on the batch just trained: KL(pi_new || base) and KL(pi_new || pi_old), where
        pi_old is the policy that sampled (its log-probs were the update's own, detached)."""
        t0 = time.perf_counter()
        live = [k for k in idx if self.trainer.cells[k].state == "running"]
        sub = {k: batches[k] for k in live}
        missing = {k: b for k, b in sub.items() if k not in ref}
        old = dict(self.trainer.last_logps)
        ref = {**ref, **self._ref_logps(missing)}
        t_new = time.perf_counter()
        ledger.spent("reference", t_new - t0)  # the monitor's reference forward (the new policy's: other)
        new = self._policy_logps(sub)
        for k in live:
            row, mask = out[self.members[k].name], batches[k]["completion_mask"]
            if self.members[k].beta == 0 and k in old:  # beta > 0: logged every step already
                self._kl_ref_metrics(row, k, batches[k], ref[k], old[k])
            if k in old:
                log_rho = (new[k] - old[k]).float()
                rho = torch.exp(log_rho)
                row["kl_new_old"] = klmod.masked_mean(rho * log_rho - rho + 1, mask).item()
                row["kl_new_old/logratio"] = klmod.masked_mean(log_rho, mask).item()
                # one update per step here: the rollout-to-updated KL is the last update's (solo trainer's names)
                row["kl_new_old/update"], row["kl_new_old/update/logratio"] = row["kl_new_old"], row["kl_new_old/logratio"]
            row["time/kl_monitor_s"] = time.perf_counter() - t0
            row["time/kl_new_old_s"] = time.perf_counter() - t_new  # as the solo trainer's: the new policy's forward


def finite_row(row: dict) -> bool:
    return all(math.isfinite(v) for v in row.values() if isinstance(v, float))
