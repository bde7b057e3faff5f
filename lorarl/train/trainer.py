"""`LorarlGRPOTrainer`: TRL 1.16's GRPOTrainer with reward deposits, per-token advantages, an own KL term.

What it changes, and nothing else (facts in /work/shared/notes/trl-grpo-1.16.md):

* ``_calculate_rewards``: the cell's regime (:mod:`lorarl.rewards`) turns the rollouts into reward
  deposits (plus DAPO's soft overlong penalty on the last token); TRL still sees one scalar per
  completion (the sum of its deposits) for its own reward metrics.
* ``_generate_and_score_completions``: replaces TRL's ``[B]`` advantages by the ``[B, T]`` advantages of
  :func:`lorarl.train.advantages.advantages_from_deposits`, refills degenerate groups with freshly sampled
  ones (DAPO dynamic sampling, :mod:`lorarl.train.dynamic_sampling`), and runs the reference forward, only when ``beta > 0``.
* HF rollouts: ``rollout.generation_batch_size`` rows at a time, samples independent of it (:mod:`lorarl.train.rowsample`).
* the data order and the sampling stream are the cell's own (:mod:`lorarl.train.streams`), the pack loop's, so a
  cell trains the same in a solo job and in a pack (docs/packed.md, "One cell, one result").
* ``_compute_loss``: TRL's loss (TRL's own ``beta`` is forced to 0, so TRL never touches a reference)
  plus ``beta * aggregate(estimator)``, aggregated exactly as TRL aggregates its policy loss.

The reference policy is a frozen copy of the ORIGINAL base model taken before any adapter is applied
(residual inits such as PiSSA rewrite base weights, so "adapter disabled" is not the reference).
With ``beta = 0`` nothing calls the reference during a step; every ``kl_monitor_every`` training steps
(at the end of the step's last update), outside the timing, a no-grad monitor measures on the batch
just trained on KL(pi || base) and, with one policy forward, ``kl_new_old``: KL(pi_new || pi_old) from
the rollout policy (TRL's old log-probs) to the policy after the step's updates (paper 003 Figs. 5/6),
and ``kl_new_old/update``: the last update's alone (equal with one update per step; with
``num_iterations > 1`` a later pass's forward gives it free). Monitor costs are logged as ``time/*``,
outside ``time/step_s`` and outside the MetricsRecorder's ``step_time_s``.

Several processes (torch.distributed through accelerate, :mod:`lorarl.train.ranks`): each rank scores whole
prompt groups, lorarl's metrics are reduced over the ranks and the PPO mini-batches are the one-process ones.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from trl import GRPOTrainer

from lorarl import ledger
from lorarl.numerics import kl as klmod
from lorarl.train.advantages import advantages_from_deposits
from lorarl.numerics.divergence import nan_reward_fault
from lorarl.numerics.invariant import trainer_kernels, vllm_engine_env
from lorarl.train.dynamic_sampling import flat_prompts_fault
from lorarl.train.microbatch import MicroBatching
from lorarl.train.tokenbudget import check_world
from lorarl.train.monitors import KLMonitors, StepHooks
from lorarl.train.ranks import RankSharding, check_ranks
from lorarl.train.prompt_fit import LeftTruncation, fixed_widths
from lorarl.rewards import Deposits, Regime, Rollouts, decode_tokens, overlong_penalty
from lorarl.train.rollout import FreshnessGate, attach_vllm, engine_kwargs, llm_extra_kwargs
from lorarl.train.rowsample import ChunkedRollouts
from lorarl.train.streams import CellStreams, sampling_generator
from lorarl.train.sharding import Fsdp2Sharding

class _RegimeReward:
    """Placeholder reward function carrying the regime's name (rewards come from the regime)."""

    def __init__(self, regime: Regime):
        self.__name__ = regime.name

    def __call__(self, *args, **kwargs):
        raise RuntimeError("LorarlGRPOTrainer computes rewards through its regime, not reward functions")


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict):  # conversational: last message
        content = x[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    return str(x)


class LorarlGRPOTrainer(Fsdp2Sharding, KLMonitors, RankSharding, CellStreams, ChunkedRollouts, MicroBatching, LeftTruncation,
                        GRPOTrainer):
    """GRPOTrainer whose advantages come from reward deposits and whose KL term is its own.

    ``kl_beta`` is the KL coefficient of lorarl's own KL term; TRL's ``args.beta`` must be 0 (TRL's
    reference code never runs). ``lorarl.train.trl_args`` builds both from a cell config.
    ``ref_model``: the frozen base copy (see :func:`lorarl.numerics.kl.frozen_reference`), or ``"auto"`` to copy ``model``
    here when it is not yet PEFT-wrapped; needed when ``kl_beta > 0`` or ``kl_monitor_every > 0``.
    """

    def __init__(self, model: Any, regime: Regime, args: Any, *, kl_beta: float = 0.0, ref_model: Any = "auto",
                 kl_estimator: str = "k3", kl_monitor_every: int = 0, dynamic_sampling: bool = False,
                 overlong_buffer: int = 0, overlong_factor: float = 1.0, dynamic_sampling_max_batches: int = 3,
                 rollout: Any = None, grading: Any = None, micro_batch_size: int | None = None,
                 micro_batch_tokens: int | None = None, prompt_keep: int | None = None,
                 generation_engine: Any = None, prompt_width: int | None = None, batch_invariant: bool = False,
                 **kwargs):
        klmod.estimator(kl_estimator)  # validates the name
        if kwargs.get("reward_funcs") is not None:
            raise ValueError("pass a regime, not reward_funcs")
        kwargs.pop("reward_funcs", None)
        if float(args.beta) != 0.0:
            raise ValueError(f"args.beta={args.beta}: TRL's beta must be 0 (lorarl adds its own KL term); "
                             "pass the coefficient as kl_beta (lorarl.train.trl_args builds both)")
        beta = float(kl_beta)
        if ref_model == "auto":
            ref_model = klmod.frozen_reference(model) if klmod.needs_reference(beta, kl_monitor_every) else None
        if ref_model is None and beta > 0:
            raise ValueError("beta > 0 needs ref_model: a frozen copy of the base taken before the adapter")
        if args.scale_rewards not in ("group", "none"):
            raise ValueError(f"scale_rewards {args.scale_rewards!r} is not supported; use 'group' or 'none'")
        if args.loss_type not in klmod.LOSS_TYPES:
            raise ValueError(f"loss_type {args.loss_type!r} is not supported; allowed: {', '.join(klmod.LOSS_TYPES)}")
        if args.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(f"importance_sampling_level {args.importance_sampling_level!r}; allowed: token, sequence")
        self.sample_generator = sampling_generator(args.seed)  # the cell's sampling stream, as in a pack (streams)
        vllm_engine_env(batch_invariant and bool(args.use_vllm))  # runtime.batch_invariant (lorarl.numerics.invariant)
        trainer_kernels(batch_invariant, "cuda" if torch.cuda.is_available() and not getattr(args, "use_cpu", False) else "cpu")
        with llm_extra_kwargs(**engine_kwargs(args, rollout)):  # the cell's seed, enforce_eager, logprobs_mode
            super().__init__(model=model, reward_funcs=[_RegimeReward(regime)], args=args, **kwargs)
        # vLLM: effective-weight push, the engine's logprobs checked comparable with the trainer's, settings printed
        self.freshness: FreshnessGate | None = attach_vllm(self, rollout) if self.use_vllm else None
        if self.accelerator.num_processes > 1:  # a prompt group on one rank; not yet wired: vLLM
            check_ranks(self, args)
        self.regime = regime
        self.grading = grading  # answer format + math-verify settings of the accuracy metric (reward.*)
        self.micro_batch_size = micro_batch_size  # rows per forward/backward (lorarl.train.microbatch); None: all
        self.micro_batch_tokens = micro_batch_tokens  # token positions per forward/backward (lorarl.train.tokenbudget)
        check_world(micro_batch_tokens, self.accelerator.num_processes)  # one process only, for now
        self.prompt_keep = prompt_keep  # train.prompt_overflow truncate_left: the last N prompt tokens (None: all)
        # prompt columns of every rollout and update batch (lorarl.train.prompt_fit.prompt_width), completions padded to
        # max_completion_length: a row's arithmetic is the pack's (fixed widths), whatever the rest of its batch
        self.prompt_width = prompt_width
        self.generation_batch_size = getattr(rollout, "generation_batch_size", None)  # hf: rows generated at once
        self.generation_engine = generation_engine  # hf: runtime.generation, KV cache and compiled decode (lorarl.decoding)
        self.kl_beta = beta
        self.kl_estimator = kl_estimator
        self.kl_importance_correction = bool(args.use_bias_correction_kl)
        self.kl_monitor_every = int(kl_monitor_every)
        self.dynamic_sampling = dynamic_sampling
        self.dynamic_sampling_max_batches = int(dynamic_sampling_max_batches)
        if dynamic_sampling:
            from lorarl.train.dynamic_sampling import PromptSampler

            self._prompt_sampler = PromptSampler(self.train_dataset, args.seed)
        self.overlong_buffer, self.overlong_factor = int(overlong_buffer), float(overlong_factor)
        self.reference_model = ref_model
        if ref_model is not None:
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(ref_model, temperature=self.temperature,
                              cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
            ref_model.to(self.accelerator.device)
            ref_model.requires_grad_(False)
            ref_model.eval()
        self._captured: list[torch.Tensor] | None = None
        self._prompt_ids_list: list[list[int]] | None = None
        self._deposits: Deposits | None = None
        self.adv_std_peak = 0.0
        self._last_batch: tuple[dict, torch.Tensor] | None = None
        self._step_t0 = time.perf_counter()
        self._step_tokens = 0.0
        self.add_callback(StepHooks(self))

    # ------------------------------------------------------------------ helpers
    def _log(self, name: str, value: float, mode: str = "train") -> None:
        self._metrics[mode][name].append(float(value))

    def _forward_logps(self, model: Any, batch: dict) -> torch.Tensor:
        """Per-token log-probs of the batch's completion tokens under ``model`` (no grad)."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model, ids, attn, batch["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size)
        return logps

    def _student_logps(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        from trl.trainer.utils import pad

        dev, pid = self.accelerator.device, self._tokenizer.pad_token_id
        p = [torch.tensor(x, dtype=torch.long) for x in prompt_ids]
        c = [torch.tensor(x, dtype=torch.long) for x in completion_ids]
        batch = {
            "prompt_ids": pad(p, padding_value=pid, padding_side="left").to(dev),
            "prompt_mask": pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left").to(dev),
            "completion_ids": pad(c, padding_value=pid, padding_side="right").to(dev),
            "completion_mask": pad([torch.ones_like(x) for x in c], padding_value=0, padding_side="right").to(dev),
        }
        logps = self._forward_logps(self.model, batch).float().cpu()
        return [logps[i, : len(ids)].tolist() for i, ids in enumerate(completion_ids)]

    # ------------------------------------------------------------------ TRL overrides
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._captured is not None:  # only inside _compute_loss: the policy's log-probs with grad
            self._captured.append(out[0])
        return out

    def _generate(self, prompts: list):
        t0, pushed = time.perf_counter(), ledger.total("handoff")
        out = super()._generate(prompts)  # HF generate, or vLLM: weight sync (when the step moved) + sampling
        mode = "train" if self.model.training else "eval"
        self._log("time/generate_s", time.perf_counter() - t0, mode)
        ledger.spent("generation", time.perf_counter() - t0 - (ledger.total("handoff") - pushed))  # push apart
        self._log("rollout/tokens", self._gsum(sum(len(ids) for ids in out[1]))[0], mode)  # every rank's
        self._prompt_ids_list = out[0]
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        mode = "train" if self.model.training else "eval"
        t0 = time.perf_counter()
        texts = [_text(c) for c in completions]
        answers = [str(x["answer"]) for x in inputs] if inputs and "answer" in inputs[0] else None
        rollouts = Rollouts(
            prompts=[_text(p) for p in prompts], completions=texts,
            prompt_ids=[list(map(int, x)) for x in self._prompt_ids_list],
            completion_ids=[list(map(int, x)) for x in completion_ids_list],
            token_texts=decode_tokens(self._tokenizer, completion_ids_list),
            answers=answers if self.regime.needs_gold else None,  # only a regime that grades sees gold
        )
        if self.regime.needs_student_logps:
            rollouts.student_logps = self._student_logps(rollouts.prompt_ids, rollouts.completion_ids)
        dep = self.regime.deposits(rollouts)
        if mode == "train":  # test hooks LORARL_FAULT=nan_reward_at_step:N, flat_prompts:N
            nan_reward_fault(dep, int(self.state.global_step) + 1)
            flat_prompts_fault(dep, rollouts.prompts)
        if len(dep) != len(texts):
            raise ValueError(f"regime {self.regime.name} returned {len(dep)} deposit lists for {len(texts)} completions")
        accuracy = None
        if self.regime.reports_accuracy:
            accuracy = list(getattr(self.regime, "last_correct", None) or [v[0] for v in dep.values])
        elif answers is not None:
            from lorarl.rewards.outcome import grade

            accuracy = grade(texts, answers, settings=self.grading)  # monitoring only: never reaches the loss of this regime
        penalized = 0
        for i, ids in enumerate(rollouts.completion_ids):
            pen = overlong_penalty(len(ids), self.max_completion_length, self.overlong_buffer, self.overlong_factor)
            if pen:
                dep.add(i, max(len(ids) - 1, 0), pen)
                penalized += 1
        self._deposits = dep
        self._lengths = [len(ids) for ids in rollouts.completion_ids]

        from lorarl.grading.verify import extract_boxed
        from lorarl.grading.answer_formats import has_answer

        eos = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        n = len(texts)  # means over the completions (deposits) of every rank (lorarl.train.ranks)
        if accuracy is not None:
            self._log_mean("accuracy", sum(accuracy), n, mode)
        for term, values in (getattr(self.regime, "last_terms", None) or {}).items():  # reward.terms, unweighted
            self._log_mean(f"reward_terms/{term}", sum(values), n, mode)
        self._log_mean("frac_boxed", sum(extract_boxed(t) is not None for t in texts), n, mode)
        fmt = getattr(self.grading, "answer_format", "boxed")  # answers the reward's format can read
        self._log_mean("frac_answered", sum(has_answer(fmt, t) for t in texts), n, mode)
        self._log_mean("frac_truncated", sum(bool(ids) and ids[-1] not in eos for ids in rollouts.completion_ids), n,
                       mode)
        self._log_mean("deposits/per_completion", sum(dep.counts), n, mode)
        all_vals = [v for vals in dep.values for v in vals]
        self._log_mean("deposits/mean", sum(all_vals), len(all_vals), mode)
        if self.overlong_buffer:
            self._log_mean("overlong/frac_penalized", penalized, n, mode)
        self._log("time/reward_s", time.perf_counter() - t0, mode)
        ledger.spent("reward", time.perf_counter() - t0)
        rewards = torch.tensor(dep.totals, dtype=torch.float32, device=self.accelerator.device)
        return self.accelerator.gather(rewards.unsqueeze(1))  # [B, 1] of every rank, as TRL's own (it slices)

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        out, degenerate_P = self._score_round(inputs, mode)
        if self.dynamic_sampling and mode == "train":
            out = self._refill(out, degenerate_P)
        if self.kl_beta > 0:
            t0 = time.perf_counter()
            out["lorarl_ref_logps"] = self._forward_logps(self.reference_model, out)
            self._log("time/ref_forward_s", time.perf_counter() - t0, mode)
            ledger.spent("reference", time.perf_counter() - t0)
        return out

    def _score_round(self, inputs, mode: str):
        """TRL's generation + scoring of one batch, with lorarl's ``[B, T]`` advantages; returns the
        batch and which prompt groups are degenerate (all deposits equal)."""
        t0 = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self._log("time/score_s", time.perf_counter() - t0, mode)  # generation + rewards + old-policy forward
        sampler_BT, policy_BT = out.get("sampling_per_token_logps"), out.get("old_per_token_logps")
        if self.freshness is not None and mode == "train" and sampler_BT is not None and policy_BT is not None:
            mask_BT = out["completion_mask"] * out.get("tool_mask", 1)
            several = self.accelerator.num_processes > 1  # the whole batch's statistics on every rank
            for name, value in self.freshness.update(self.state.global_step, sampler_BT, policy_BT, mask_BT,
                                                     *((self._gsum, self._gmax) if several else ())).items():
                self._log(name, value, mode)  # raises RolloutStaleError after freshness_patience stale steps
        if self.prompt_width is not None and mode == "train":
            out = fixed_widths(out, self.prompt_width, self.max_completion_length, self._tokenizer.pad_token_id)
        dep, dev = self._deposits, self.accelerator.device
        B, T = out["completion_ids"].shape
        group = self.num_generations if mode == "train" else self.num_generations_eval
        valid_BT = torch.arange(T, device=dev).unsqueeze(0) < torch.tensor(self._lengths, device=dev).unsqueeze(1)
        row_D, pos_D, val_D = dep.flat(dev)
        adv = advantages_from_deposits(row_D, pos_D, val_D, valid_BT, group, dense=dep.dense,
                                       scale=self.scale_rewards != "none")
        adv_BT = adv.adv_BT
        vals = adv_BT[valid_BT].double()  # statistics over the valid tokens of every rank
        k, s1, s2 = self._gsum(vals.numel(), vals.sum(), (vals * vals).sum())
        if k:
            std = max(s2 - s1 * s1 / k, 0.0) ** 0.5 / (k - 1) ** 0.5 if k > 1 else 0.0
            self.adv_std_peak = max(self.adv_std_peak, std) if mode == "train" else self.adv_std_peak
            self._log("adv/std", std, mode)
            self._log("adv/std_peak", self.adv_std_peak, mode)
            self._log("adv/abs_max", self._gmax(vals.abs().max().item() if vals.numel() else 0.0), mode)
        out["advantages"] = adv_BT
        degenerate_P = adv.stats.degenerate_P
        if mode == "train":  # any cell: the doctor projects DAPO refills from it
            self._log_mean("rollout/degenerate_rate", degenerate_P.float().sum().item(), degenerate_P.numel(), mode)
        return out, degenerate_P.tolist()

    def _refill(self, first: dict, degenerate: list[bool]) -> dict:
        """DAPO dynamic sampling (lorarl.train.dynamic_sampling): sample more prompt groups until the batch
        holds as many groups with signal as it has slots, at most ``dynamic_sampling_max_batches``
        rounds; degenerate groups fill what is left. On several ranks the decisions are the one process's:
        every rank sees every group's flag (rank order = the one-process batch), samples its rows of each
        round, and takes its share of the chosen groups from the rounds gathered over the ranks."""
        from lorarl.train.dynamic_sampling import concat_batches, plan_refill, take_groups
        from lorarl.train.ranks import gather_batch, rank_rows

        W, me, pad = self.accelerator.num_processes, self.accelerator.process_index, self._tokenizer.pad_token_id
        G, degenerate = self.num_generations, self._every_group(degenerate)
        P = len(degenerate)
        self._log("dynamic_sampling/frac_groups_dropped", sum(degenerate) / P)
        rounds = [first]
        kept = [(0, g) for g in range(P) if not degenerate[g]]
        degen = [(0, g) for g in range(P) if degenerate[g]]
        while len(kept) < P and len(rounds) < self.dynamic_sampling_max_batches:
            r = len(rounds)
            rows = self._prompt_sampler.draw(P, G, self.state.global_step, r)
            out, deg = self._score_round(rows[me * len(rows) // W:(me + 1) * len(rows) // W], "train")
            deg = self._every_group(deg)
            rounds.append(out)
            kept += [(r, g) for g in range(len(deg)) if not deg[g]]
            degen += [(r, g) for g in range(len(deg)) if deg[g]]
        chosen = plan_refill(kept, degen, P)
        if W > 1:  # every rank's rows of every round (collective: the same rounds on every rank)
            rounds = [gather_batch(self.accelerator, o, pad) for o in rounds]
        parts = [take_groups(o, [g for rr, g in chosen if rr == r], G) for r, o in enumerate(rounds)
                 if any(rr == r for rr, _ in chosen)]
        self._log("dynamic_sampling/rounds", len(rounds))
        self._log("dynamic_sampling/frac_groups_degenerate", max(P - len(kept), 0) / P)
        whole = concat_batches(parts, pad)
        return whole if W == 1 else rank_rows(whole, me, W)

    def _every_group(self, flags: list[bool]) -> list[bool]:
        """Every rank's per-group flags in rank order (one process: its own)."""
        if self.accelerator.num_processes == 1:
            return flags
        from accelerate.utils import gather_object

        return [bool(f) for f in gather_object(list(flags))]

    def _compute_loss(self, model, inputs):
        self._captured = []
        try:
            loss = super()._compute_loss(model, inputs)
            captured = self._captured
        finally:
            self._captured = None
        logp_BT = captured[0]
        mode = "train" if self.model.training else "eval"
        mask_BT = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask_BT = mask_BT * inputs["tool_mask"]
        old_BT = inputs.get("old_per_token_logps")
        old_BT = logp_BT.detach() if old_BT is None else old_BT
        if mode == "train":  # verl's ppo_kl: before this update, over its (micro-)batch (lorarl.numerics.kl.ppo_kl)
            self._log("ppo_kl", self._gmasked_mean(klmod.ppo_kl(logp_BT.detach(), old_BT), mask_BT), mode)
        if self.kl_beta > 0:
            ref_BT = inputs["lorarl_ref_logps"]
            weight_BT = klmod.importance_weight(logp_BT, old_BT, mask_BT, self.importance_sampling_level) \
                if self.kl_importance_correction else None
            kl_BT = klmod.per_token_kl(self.kl_estimator, logp_BT, ref_BT, weight_BT)
            train = mode == "train"
            term = klmod.aggregate(
                kl_BT, mask_BT, self.loss_type, max_completion_length=self.max_completion_length,
                num_items_in_batch=inputs["num_items_in_batch"],
                grad_accum=self.current_gradient_accumulation_steps if train else 1,
                steps_per_generation=self.args.steps_per_generation if train else 1,
                num_processes=self.accelerator.num_processes)
            loss = loss + self.kl_beta * term
            self._log("kl", self._gmasked_mean(kl_BT.detach(), mask_BT), mode)
            self._log_kl_ref(logp_BT.detach(), ref_BT, mask_BT, mode)
        if mode == "train" and torch.is_grad_enabled():
            if self._micro_parts is not None:  # one chunk of a micro-batched update (lorarl.train.microbatch)
                self._micro_parts.append(logp_BT.detach())
            else:
                self._remember_batch(inputs, logp_BT.detach(), mask_BT)
        return loss
