"""A cell's two random streams, the same in every host: its data order and its sampling generator.

    order = DataOrder(n_prompts, seed)          # the prompts of step s are order's prompts [s*P, (s+1)*P)
    gen = sampling_generator(seed)              # the rollouts' uniforms (lorarl.train.rowsample)
    sampler = OrderSampler(n_prompts, seed, P, G, repeat)   # TRL's train sampler over the same order

Why: a cell's numbers must not depend on which host trains it (docs/packed.md, "One cell, one result"). The pack
loop (:mod:`lorarl.pack.steps`) takes each step's prompts from the cell's :class:`DataOrder` and draws each
step's sampling uniforms from the cell's :func:`sampling_generator`; the solo job (TRL's GRPOTrainer,
:class:`lorarl.train.trainer.LorarlGRPOTrainer`) takes its prompts through :class:`OrderSampler` (the same
order, laid out as TRL's ``RepeatSampler`` lays its indices out) and draws its uniforms from the same generator.
Both streams are functions of the cell's seed alone (never of the pack's other members or the global RNG).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler

SAMPLE_STREAM = 0x5A3D  # why: the sampling generator's seed is (seed, this), distinct from the data order's


def sampler_seed(seed: int) -> int:
    """Seed of a cell's sampling generator (a stream apart from its data order's, which is seeded by ``seed``)."""
    return int(seed) * 1_000_003 + SAMPLE_STREAM


def sampling_generator(seed: int) -> torch.Generator:
    """The cell's own sampling stream (the rollouts' uniform tables), a CPU generator."""
    return torch.Generator().manual_seed(sampler_seed(seed))


class DataOrder:
    """A cell's own prompt order: a fresh permutation per epoch from its own generator, taken without gaps
    (an epoch's last prompts and the next epoch's first can share a step)."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.gen = torch.Generator().manual_seed(int(seed))
        self.perm: list[int] = []
        self.pos = 0

    def take(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.pos >= len(self.perm):
                self.perm, self.pos = torch.randperm(self.n, generator=self.gen).tolist(), 0
            out.append(self.perm[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state(), "perm": list(self.perm), "pos": self.pos}

    def load_state_dict(self, d: dict) -> None:
        self.gen.set_state(d["gen"])
        self.perm, self.pos = list(d["perm"]), int(d["pos"])


class OrderSampler(Sampler):
    """TRL's train sampler over a cell's :class:`DataOrder`: each generation batch's ``prompts`` prompts are the
    order's next ones, each index ``generations`` times in a row, the batch ``repeat`` times (TRL's
    ``RepeatSampler`` layout: ``num_iterations x steps_per_generation``). One sampler epoch is TRL's length
    (``n // prompts`` generation batches); epoch ``e`` (HF's Trainer calls :meth:`set_epoch`) starts at prompt
    ``e * (n // prompts) * prompts`` of the order, so generation batch ``s`` holds the order's prompts
    ``[s*P, (s+1)*P)`` in any epoch and after a resume (the order is recomputed from the seed, not carried)."""

    def __init__(self, n: int, seed: int, prompts: int, generations: int, repeat: int = 1):
        if n < prompts:
            raise ValueError(f"{n} training prompts for train.prompts_per_step={prompts}: a step needs at least that many")
        self.n, self.seed, self.prompts, self.generations, self.repeat = n, int(seed), prompts, generations, repeat
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return (self.n // self.prompts) * self.prompts * self.generations * self.repeat

    def __iter__(self) -> Iterator[int]:
        batches = self.n // self.prompts
        order = DataOrder(self.n, self.seed)
        order.take(self.epoch * batches * self.prompts)  # the earlier epochs' prompts
        for _ in range(batches):
            chunk = order.take(self.prompts)
            for _ in range(self.repeat):
                for i in chunk:
                    yield from [i] * self.generations


class CellStreams:
    """Mixin of ``LorarlGRPOTrainer``: TRL's train sampler over the cell's :class:`DataOrder`, the cell's sampling
    generator (``sample_generator``, read by :class:`lorarl.train.rowsample.ChunkedRollouts`), saved and restored
    with the HF Trainer's RNG states in every checkpoint, and, with one update per generation batch, that update's
    rows in the order they were sampled (the pack's order: TRL's row shuffle would only reorder the update's sums,
    which moves a gradient by an ulp and Adam turns that into 1e-6 on the adapter)."""

    sample_generator: torch.Generator  # why: the cell's sampling stream (set by the trainer from args.seed)

    def _get_train_sampler(self, dataset=None) -> Sampler:
        dataset = self.train_dataset if dataset is None else dataset
        return OrderSampler(len(dataset), self.args.seed, self.args.generation_batch_size // self.num_generations,
                            self.num_generations, self.num_iterations * self.args.steps_per_generation)

    def _sampling_file(self, folder: str) -> str:
        import os

        return os.path.join(folder, f"lorarl_sampling_{self.args.process_index}.pt")

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        torch.save(self.sample_generator.get_state(), self._sampling_file(output_dir))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        import os

        super()._load_rng_state(checkpoint)
        if checkpoint is not None and os.path.isfile(self._sampling_file(checkpoint)):
            self.sample_generator.set_state(torch.load(self._sampling_file(checkpoint), weights_only=True))

    def _prepare_inputs(self, generation_batch: dict) -> dict:
        if not self.model.training or self.args.steps_per_generation > 1:
            return super()._prepare_inputs(generation_batch)  # PPO mini-batches: TRL's shuffled split
        if self._step % self.num_iterations == 0 or self._buffered_inputs is None:
            self._buffered_inputs = [self._generate_and_score_completions(generation_batch)]
        return self._buffered_inputs[0]
