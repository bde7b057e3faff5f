"""One cell's training on several processes: what lorarl adds on top of TRL's multi-process GRPO, rank-correct.

The engine is torch.distributed through accelerate, as TRL uses it: ``torchrun`` (one node) or submitit's
multi-task Slurm job (lorarl.pipeline.jobs.train_layout) starts one process per GPU (per CPU rank in the tests, backend gloo);
the HF Trainer wraps the policy in DDP (adapter cells) or FSDP2 (``fsdp`` layouts), and TRL hands every rank
its share of the generation batch: rank ``r`` gets rows ``[r*B/N, (r+1)*B/N)`` of the study's ``P x G`` rows.

What this module makes of it (the ranks train exactly what one process trains, to float rounding:
tests/train/test_distributed.py):

* A prompt group never spans two ranks (``N`` divides ``train.prompts_per_step``), so lorarl's ``[B, T]``
  advantages from reward deposits are computed on each rank from whole groups.
* Rollouts: the sampling uniforms of row ``i`` are row ``i`` of ONE table drawn for the whole generation
  batch from the cell's own sampling generator, the same on every rank (lorarl.train.streams; every rank takes
  its rows of the table: lorarl.train.rowsample.batch_uniforms) and prompts are left-padded to the cell's
  prompt width (at least the batch's widest prompt over all ranks), so a row samples the same tokens on 1 rank
  or on N.
* Mini-batches: after scoring, the ranks gather the generation batch, shuffle it with the one permutation a
  single process draws, cut it into ``steps_per_generation`` PPO mini-batches and each rank trains on its
  ``1/N`` of every mini-batch (:meth:`RankSharding._prepare_inputs`); DDP averages the gradients, so an
  update's gradient is the one-process gradient of the same mini-batch (``loss_type`` grpo, dr_grpo, dapo;
  bnpo normalises by each rank's own token count, as TRL defines it on several processes).
* lorarl's own metrics (accuracy, deposits, advantages, degenerate groups, KL and its monitors, tokens/s)
  are reduced over the ranks as sums and counts, so a logged value is the one-process value of the whole
  batch, identical on every rank (the divergence and collapse monitors then stop every rank together).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

from lorarl.train.dynamic_sampling import _pad_to  # one padding rule for batches joined along rows

TIMEOUT_ENV = "LORARL_COLLECTIVE_TIMEOUT_S"  # a rank that stops answering fails the job after this long
DEFAULT_TIMEOUT_S = 600


def world_size() -> int:
    """Processes of this training job (torchrun / submitit's ranks set WORLD_SIZE; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_main() -> bool:
    """Rank 0: the one process that writes files, MLflow and the cell's outputs."""
    return rank() == 0


def collective_timeout_s() -> int:
    return int(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def init() -> None:
    """Join the job's process group now (accelerate's PartialState, the Trainer's later one is the same), with
    the collective timeout: a rank killed mid-step makes the others fail after it instead of hanging."""
    if world_size() > 1:
        from accelerate import PartialState

        PartialState(timeout=timedelta(seconds=collective_timeout_s()))


def _group() -> Any:
    import torch.distributed as dist

    return dist if world_size() > 1 and dist.is_available() and dist.is_initialized() else None


def barrier() -> None:
    dist = _group()
    if dist is not None:
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a run id, a resume decision)."""
    dist = _group()
    if dist is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_layout(prompts_per_step: int, generations: int, update_rows: int, ranks: int) -> None:
    """A prompt group lives on one rank and every rank gets the same share of each update."""
    if ranks < 1:
        raise ValueError(f"ranks per training job must be >= 1; got {ranks}")
    if prompts_per_step % ranks:
        raise ValueError(f"train.prompts_per_step ({prompts_per_step}) must be a multiple of the job's {ranks} ranks "
                         "(a prompt group is never split over ranks); allowed ranks: divisors of prompts_per_step")
    if update_rows % ranks:
        raise ValueError(f"one update's {update_rows} sequences (train.mini_batch_prompts x train.generations="
                         f"{generations}) must split evenly over the job's {ranks} ranks")


class RankSharding:
    """Mixin of ``LorarlGRPOTrainer``: global reductions of lorarl's metrics and the one-process mini-batches."""

    # ------------------------------------------------------------------ reductions (no-ops on one process)
    def _gsum(self, *values: float) -> list[float]:
        """Sums over the ranks (float64), in one collective."""
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            t = self.accelerator.reduce(t, reduction="sum")
        return t.tolist()

    def _gmax(self, value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.accelerator.device)
        return float(self.accelerator.gather(t).max()) if self.accelerator.num_processes > 1 else float(value)

    def _log_mean(self, name: str, total: float, count: float, mode: str = "train") -> None:
        """Log sum/count of the whole batch over every rank."""
        s, n = self._gsum(total, count)
        self._log(name, s / max(n, 1.0), mode)

    def _gmasked_mean(self, x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
        """:func:`lorarl.numerics.kl.masked_mean` over the tokens of every rank."""
        m = mask_BT.to(x_BT.dtype)
        s, n = self._gsum(float((x_BT * m).sum()), float(m.sum()))
        return s / max(n, 1.0)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """CPU ranks (the tests' gloo): the HF Trainer loads the optimiser with ``map_location=args.device``, which
        accelerate sets to ``cpu:<index>`` and torch.load refuses; load it to "cpu" (the tensors are the same)."""
        if self.accelerator.num_processes == 1 or self.accelerator.device.type != "cpu":
            return super()._load_optimizer_and_scheduler(checkpoint)
        real = torch.load

        def load(*args, map_location=None, **kwargs):
            if isinstance(map_location, torch.device) and map_location.type == "cpu":
                map_location = "cpu"
            return real(*args, map_location=map_location, **kwargs)

        torch.load = load
        try:
            return super()._load_optimizer_and_scheduler(checkpoint)
        finally:
            torch.load = real

    # ------------------------------------------------------------------ one-process mini-batches
    def _prepare_inputs(self, generation_batch: dict) -> dict:
        if self.accelerator.num_processes == 1 or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        from trl.trainer.utils import split_tensor_dict

        spg = self.args.steps_per_generation
        if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
            local = self._generate_and_score_completions(generation_batch)
            whole = gather_batch(self.accelerator, local, self._tokenizer.pad_token_id)
            # TRL's shuffle_sequence_dict, with the permutation rank 0 draws (one process's draw) on every rank
            perm = broadcast(torch.randperm(whole["completion_ids"].size(0)) if is_main() else None)
            whole = {k: _take(v, perm) for k, v in whole.items()}
            parts = split_tensor_dict(whole, spg)
            self._buffered_inputs = [rank_rows(p, self.accelerator.process_index, self.accelerator.num_processes)
                                     for p in parts]
        return self._buffered_inputs[self._step % spg]


def global_max(accelerator: Any, value: int) -> int:
    """The largest ``value`` over the ranks (e.g. the generation batch's widest prompt)."""
    if accelerator.num_processes == 1:
        return int(value)
    return int(accelerator.gather(torch.tensor([int(value)], dtype=torch.long, device=accelerator.device)).max())


def row_slice(accelerator: Any, rows: int) -> tuple[int, slice]:
    """(rows of the whole generation call over every rank, this rank's rows in it): TRL's process slice."""
    r = accelerator.process_index
    return rows * accelerator.num_processes, slice(r * rows, (r + 1) * rows)


LEFT_PADDED = ("prompt_ids", "prompt_mask")


def gather_batch(accelerator: Any, batch: dict, pad_id: int) -> dict:
    """Every rank's scored rows, in rank order (= the one-process generation batch); ``[B, T]`` tensors
    padded to the widest rank first (prompts on the left, completion-aligned tensors on the right)."""
    from accelerate.utils import gather_object

    B = batch["completion_ids"].size(0)
    out: dict = {}
    for key, v in batch.items():
        if v is None or (isinstance(v, torch.Tensor) and v.dim() == 0):
            out[key] = v  # num_items_in_batch: already the whole batch's
        elif isinstance(v, torch.Tensor) and v.size(0) == B:
            if v.dim() >= 2:
                width = int(accelerator.gather(torch.tensor([v.size(1)], device=v.device)).max())
                v = _pad_to(v, width, pad_id if key.endswith("_ids") else 0, left=key in LEFT_PADDED)
            out[key] = accelerator.gather(v.contiguous())
        elif isinstance(v, list) and len(v) == B:
            out[key] = gather_object(v)
        else:
            raise ValueError(f"cannot gather the generation batch's {key!r} over ranks "
                             "(multimodal inputs are not supported on several ranks)")
    return out


def _take(v: Any, perm: torch.Tensor) -> Any:
    if isinstance(v, torch.Tensor) and v.dim() >= 1:
        return v[perm.to(v.device)]
    return [v[i] for i in perm.tolist()] if isinstance(v, list) else v


def rank_rows(batch: dict, r: int, n: int) -> dict:
    """Rank ``r``'s ``1/n`` of a mini-batch: its ``r``-th contiguous block of rows."""
    B = batch["completion_ids"].size(0)
    lo, hi = r * B // n, (r + 1) * B // n
    return {k: (v[lo:hi] if (isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == B)
                or (isinstance(v, list) and len(v) == B) else v) for k, v in batch.items()}


def check_ranks(trainer: Any, args: Any) -> None:
    """What several ranks need (lorarl.train.ranks): whole prompt groups per rank (vLLM: one engine per rank or per
    tensor-parallel group, pushed the whole effective weights, FSDP2 shards gathered; per-row seeds:
    lorarl.train.vllm_seeds)."""
    if (args.per_device_train_batch_size * args.steps_per_generation) % trainer.num_generations:
        raise ValueError(f"a rank's {args.per_device_train_batch_size * args.steps_per_generation} rollouts are not "
                         f"whole groups of {trainer.num_generations}: train.prompts_per_step must be a multiple of "
                         f"the {trainer.accelerator.num_processes} ranks")
