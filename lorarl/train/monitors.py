"""The KL monitors and step timing of ``LorarlGRPOTrainer`` (a mixin; the module docstring of
:mod:`lorarl.train.trainer` says what they measure). Every mean is over the tokens of all ranks
(:class:`lorarl.train.ranks.RankSharding`), so a logged value does not depend on the number of ranks."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import TrainerCallback

from lorarl import ledger
from lorarl.numerics import kl as klmod


class KLMonitors:
    """Mixin: KL(pi || base) and KL(pi_new || pi_old) monitors, the update's wall time and tokens/s, the cost ledger's
    step and checkpoint times (lorarl.ledger)."""

    def _log_kl_ref(self, logp_BT, ref_BT, mask_BT, mode="train") -> None:
        self._log("kl_ref/k1", self._gmasked_mean(klmod.k1(logp_BT, ref_BT), mask_BT), mode)
        self._log("kl_ref/k3", self._gmasked_mean(klmod.k3(logp_BT, ref_BT), mask_BT), mode)
        self._log("kl_ref/one_sided", self._gmasked_mean(klmod.one_sided(logp_BT, ref_BT), mask_BT), mode)
        if self.kl_beta > 0:
            est = klmod.estimator(self.kl_estimator)(logp_BT, ref_BT)
            self._log("kl_ref/penalty", self.kl_beta * self._gmasked_mean(est, mask_BT), mode)

    def _log_kl_new_old(self, new_BT, old_BT, mask_BT, which: str = "") -> None:
        """KL(pi_new || pi_old) on tokens sampled from pi_old: mean of rho*log(rho) - rho + 1 (>= 0, unbiased).
        ``which``: "" = rollout policy -> updated policy (``kl_new_old``), "/update" = one optimiser update."""
        log_rho = (new_BT - old_BT).float()
        rho = torch.exp(log_rho)
        self._log(f"kl_new_old{which}", self._gmasked_mean(rho * log_rho - rho + 1, mask_BT))
        self._log(f"kl_new_old{which}/logratio", self._gmasked_mean(log_rho, mask_BT))

    def _save_checkpoint(self, model, trial):
        with ledger.phase("checkpoint"):  # HF's checkpoint save: the cost ledger's checkpoint phase (lorarl.ledger)
            return super()._save_checkpoint(model, trial)

    def _after_optimizer_step(self, global_step: int) -> None:
        """Update timing, then (every kl_monitor_every training steps) the no-grad monitors on the batch just trained."""
        wall = time.perf_counter() - self._step_t0
        self._log("time/step_s", wall)
        ledger.close_step(wall)  # the step's time no finer phase took: its update (lorarl.ledger)
        tokens = self._gsum(self._step_tokens)[0]  # every rank's tokens of the update
        self._log("tokens_per_s", tokens / wall if wall > 0 else 0.0)
        self._step_tokens = 0.0
        every = self.kl_monitor_every * self.args.steps_per_generation * self.num_iterations  # in updates
        if not every or global_step % every or self._last_batch is None:
            return
        dev = self.accelerator.device
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            self._monitors()  # no gradients, and the RNG stream of training is left exactly as it was

    def _monitors(self) -> None:
        batch, logp_BT = self._last_batch
        mask_BT = batch["completion_mask"]
        if self.kl_beta == 0 and self.reference_model is not None:
            t0 = time.perf_counter()
            ref_BT = self._forward_logps(self.reference_model, batch)
            self._log_kl_ref(logp_BT, ref_BT, mask_BT)
            self._log("time/kl_monitor_s", time.perf_counter() - t0)
            ledger.spent("reference", time.perf_counter() - t0)
        t0 = time.perf_counter()  # the end of a training step (_after_optimizer_step): its last update is done
        new_BT = self._forward_logps(self.model, batch)
        self._log_kl_new_old(new_BT, logp_BT, mask_BT, "/update")  # the last update alone
        rollout_BT = batch.get("old_per_token_logps")  # the rollout policy's; None: one update per step
        self._log_kl_new_old(new_BT, logp_BT if rollout_BT is None else rollout_BT, mask_BT)
        self._log("time/kl_new_old_s", time.perf_counter() - t0)


class StepHooks(TrainerCallback):
    """Runs after every other callback: step timing first (excludes the monitors), then the monitors."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_step_begin(self, args, state, control, **kw):
        self.trainer._step_t0 = time.perf_counter()
        ledger.step_begin()  # the cost ledger's step window (lorarl.ledger)

    def on_step_end(self, args, state, control, **kw):
        self.trainer._after_optimizer_step(state.global_step)
