"""Out-of-memory retries: what each attempt of a job runs with. Memory knobs only (runtime fields: never in a
training or evaluation signature), so a retried cell computes the same science with less memory at once.

The ladder of a job is a list of distinct rungs; attempt ``k`` runs rung ``k`` (attempt 1 = rung 1 = as
planned: the cell's settings, ``auto`` resolved for the job by lorarl.memory.auto). Training (and each member
of a pack):

1. as planned;
2. the next smaller micro-batch and generation chunk: half of each, rounded up (null = the whole batch:
   half of the update's rows / of the rollout's sequences; the vllm engine has no generation chunk);
3. rung 2 + gradient checkpointing; a cell that checkpoints already: half again instead;
4. the last rung's settings on the next larger layout the profile allows (``slurm.train.layouts.on_oom``,
   lorarl.pipeline.jobs.train_layout.oom_resources); without one the launcher refuses the attempt ("no larger
   layout allowed by the profile"). A job past its ladder otherwise: :class:`LadderExhausted`.

A cell with ``train.micro_batch_tokens`` plans the whole update's rows and runs a rung's micro-batch as that
fraction of its token budget (half the rows: half the tokens; ``train_config``).

A rung that would change nothing (a micro-batch of 1 cannot shrink) is left out, so every retry differs from
the attempt before. Evaluation (``eval.backend: hf``): ``eval.batch_size`` halved at rungs 2 and 3 (no
checkpointing in inference); the vllm backend sizes its own batches: one rung.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

NO_LAYOUT = "no larger layout allowed by the profile"


class LadderExhausted(RuntimeError):
    """Attempt ``k`` is past the job's last rung."""


@dataclass(frozen=True)
class TrainRung:
    """What one training attempt runs with (sequences; ``generation_batch_size`` None: the vllm engine)."""

    micro_batch_size: int
    generation_batch_size: int | None
    gradient_checkpointing: bool

    def record(self) -> dict[str, Any]:
        return asdict(self)


def smaller(n: int | None) -> int | None:
    """The next smaller chunk: half, rounded up (1 stays 1; None, no chunk, stays None)."""
    return None if n is None else max(1, (n + 1) // 2)


def train_ladder(planned: TrainRung) -> list[TrainRung]:
    """Every rung of a training job, attempt 1 first (see the module docstring)."""
    rungs = [planned]
    halved = TrainRung(smaller(planned.micro_batch_size), smaller(planned.generation_batch_size),
                       planned.gradient_checkpointing)
    if halved != rungs[-1]:
        rungs.append(halved)
    last = rungs[-1]
    third = (TrainRung(last.micro_batch_size, last.generation_batch_size, True) if not last.gradient_checkpointing
             else TrainRung(smaller(last.micro_batch_size), smaller(last.generation_batch_size), True))
    if third != last:
        rungs.append(third)
    return rungs


def eval_ladder(batch_size: int, backend: str = "hf") -> list[int]:
    """``eval.batch_size`` of each evaluation attempt, attempt 1 first."""
    from lorarl.evaluate.engines import BACKENDS

    rungs = [batch_size]
    if BACKENDS[backend].halves_batch:
        for _ in range(2):
            if smaller(rungs[-1]) != rungs[-1]:
                rungs.append(smaller(rungs[-1]))
    return rungs


def rung(ladder: list, attempt: int) -> Any:
    """The rung of ``attempt`` (1-based); past the last rung: LadderExhausted naming the last one."""
    if not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be a whole number >= 1; got {attempt!r}")
    if attempt > len(ladder):
        last = ladder[-1]
        last = last.record() if hasattr(last, "record") else {"eval.batch_size": last}
        raise LadderExhausted(f"out of memory on every rung of the ladder (last: {last}); {NO_LAYOUT}")
    return ladder[attempt - 1]


# ---- cell configs ------------------------------------------------------------------------------------

def planned_train(cfg: Any, device: str) -> TrainRung:
    """The rung a resolved cell config (no ``auto`` left) plans: null = the whole update / rollout."""
    t, r = cfg.train, cfg.rollout
    rows = (t.mini_batch_prompts or t.prompts_per_step) * t.generations  # sequences of one update
    batch = t.prompts_per_step * t.generations  # sequences of one rollout
    for name, v in (("train.micro_batch_size", t.micro_batch_size), ("rollout.generation_batch_size",
                                                                     r.generation_batch_size)):
        if v == "auto":
            raise ValueError(f"{name} is still auto: resolve it for the job first (lorarl.memory.auto.resolve_job)")
    ckpt = t.gradient_checkpointing == "on" or (t.gradient_checkpointing == "auto" and device == "cuda")
    gen = (r.generation_batch_size or batch) if r.engine == "hf" else None
    return TrainRung(t.micro_batch_size or rows, gen, ckpt)


def train_config(cfg: Any, r: TrainRung) -> Any:
    """``cfg`` running rung ``r`` (a copy; runtime fields only)."""
    t = cfg.train
    knob = {"micro_batch_size": r.micro_batch_size}
    if t.micro_batch_tokens:  # a token budget shrinks with the rung's share of the update's rows
        rows = (t.mini_batch_prompts or t.prompts_per_step) * t.generations
        knob = {"micro_batch_tokens": max(1, t.micro_batch_tokens * min(r.micro_batch_size, rows) // rows)}
    train = t.model_copy(update={**knob, "gradient_checkpointing": "on" if r.gradient_checkpointing else "off"})
    rollout = cfg.rollout
    if r.generation_batch_size is not None:
        rollout = rollout.model_copy(update={"generation_batch_size": r.generation_batch_size})
    return cfg.model_copy(update={"train": train, "rollout": rollout})


def eval_config(cfg: Any, batch_size: int) -> Any:
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"batch_size": batch_size})})
