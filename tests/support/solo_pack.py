"""One cell, two hosts: the shared harness of the "solo TRL job = pack of one" checks (docs/packed.md).

    cfg = cell_config(tiny_dir, adapter={"method": "dora"}, train={"beta": 0.05, "loss_type": "dapo"})
    solo = train_solo(cfg, results_dir, steps)     # TRL's GRPOTrainer, built as lorarl.train.main.train_cell builds it
    pack = train_pack_of_one(cfg, results_dir, steps)  # lorarl.pack.build + PackLoop
    assert_same_result(solo, pack, tol=1e-6)

A pack of several members (mixed ranks, each against its own solo run) and runtime knobs (a micro-batch size,
update chunks, grouped adapter terms: memory and speed, never results) go through the same harness:

    cfgs = [cell_config(tiny_dir, seed=3, adapter={"rank": 2, "alpha": 4}),
            cell_config(tiny_dir, seed=4, adapter={"rank": 8, "alpha": 16}, train={"beta": 0.05})]
    packed = train_pack(with_runtime(c, train={"micro_batch_size": 1}) for c in cfgs), results_dir, grouped=True)
    for cfg, member in zip(cfgs, packed):
        assert_same_result(train_solo(cfg, results_dir), member, tol=1e-6)

Both hosts grade with :func:`score` (deterministic, non-degenerate: an untrained tiny model is never right, so
the real grader would give flat groups and no policy gradient). Each run records every step's sampled token ids
(what the regime saw), its metrics rows and its trained adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

NOISY = ("time/", "pack/", "tokens_per_s", "step_time")  # wall-clock and pack size: not part of the result
HOST_ONLY = ("epoch", "step")  # TRL's own bookkeeping columns (the pack's rows are keyed by step)


def score(completions: list[str], answers: Any = None) -> list[float]:
    """A deterministic, non-degenerate 'grade' of a completion's text."""
    return [float(sum(map(ord, c)) % 5) / 4 for c in completions]


def cell_config(tiny_dir: str | Path, seed: int = 1, adapter: dict | None = None, train: dict | None = None) -> Any:
    """A tiny cell: 12 synthetic prompts, P = 2, G = 2, 8 completion tokens, LoRA r = 4 unless ``adapter`` says."""
    from lorarl.language.config import CellConfig

    return CellConfig(model=str(tiny_dir), seed=seed,
                      task={"name": "synthetic", "seed": 7, "n_train": 12, "n_eval": 4, "max_value": 9},
                      adapter={"method": "lora", "rank": 4, "alpha": 8, "dropout": 0.0, **(adapter or {})},
                      reward={"regime": "outcome", "answer_format": "last_number"},  # no math-verify workers
                      train={"lr": 1e-2, "prompts_per_step": 2, "generations": 2,
                             "max_completion_length": 8, "lr_scheduler": "linear", "steps": 2, **(train or {})})


class Recorded:
    """A regime that records the completion token ids it scores (one list per step), then scores them."""

    def __init__(self, regime: Any):
        self.regime, self.ids = regime, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.regime, name)

    def deposits(self, rollouts: Any) -> Any:
        self.ids.append([list(map(int, c)) for c in rollouts.completion_ids])
        return self.regime.deposits(rollouts)


@dataclass
class HostRun:
    """What one host made of the cell."""

    ids: list  # why: each step's sampled completion token ids
    rows: list  # why: each step's metrics row (noise dropped)
    weights: dict  # why: the trained adapter's tensors
    start: dict  # why: the adapter's tensors before the first step (did it train?)


def recorded_regime() -> Recorded:
    from lorarl.rewards.outcome import OutcomeDeposits

    return Recorded(OutcomeDeposits(score_fn=score))


def tensors(model: Any) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def clean_row(row: dict) -> dict:
    return {k: float(v) for k, v in row.items() if not k.startswith(NOISY) and k not in HOST_ONLY
            and isinstance(v, (int, float))}


def train_solo(cfg: Any, results_dir: str | Path) -> HostRun:
    """The solo job's trainer, built as :func:`lorarl.train.main.train_cell` builds it (the door, the registry's
    adapter, ``build_trainer``, the method's optimiser), trained for ``train.steps`` (no MLflow, no checkpoints)."""
    from lorarl.adapters import build_adapter
    from lorarl.train.prepare import prepare
    from lorarl.train.trl_args import build_trainer

    inputs = prepare(cfg, results_dir, output_dir=Path(results_dir) / "solo-ckpt")
    policy = build_adapter(inputs.model, cfg, results_dir=results_dir, precision=inputs.precision)
    start, regime = tensors(policy.model), recorded_regime()
    trainer = build_trainer(cfg, model=policy.model, tokenizer=inputs.tokenizer, args=inputs.args,
                            ref_model=inputs.ref_model, train_dataset=inputs.dataset, regime=regime,
                            grading=inputs.grading)
    policy.attach(trainer)
    trainer.train()
    rows = [clean_row(h) for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    return HostRun(ids=regime.ids, rows=rows, weights=tensors(trainer.model), start=start)


def with_runtime(cfg: Any, **sections: dict) -> Any:
    """``cfg`` with runtime fields changed (``train={"micro_batch_size": 1}``); refuses a field that is in the
    cell's training signature (a knob that may change the result by design is not a runtime knob)."""
    from lorarl.language.signature import train_signature

    fields = cfg.model_dump()
    out = type(cfg).model_validate({**fields, **{s: {**fields[s], **f} for s, f in sections.items()}})  # checked
    if train_signature(out) != train_signature(cfg):
        raise ValueError(f"not runtime-only (the training signature changes): {sections}")
    return out


def train_pack(cfgs: Any, results_dir: str | Path, update_cells: int | None = None,
               grouped: bool | None = None) -> list[HostRun]:
    """The cells as ONE pack (:func:`lorarl.pack.build.build_pack`, the PackLoop's full steps), one run per member
    in order. ``update_cells``: cells per forward/backward of the update; ``grouped``: the router's grouped adapter
    terms (None: the device's default, one cell at a time on a CPU)."""
    from types import SimpleNamespace

    from lorarl.pack.build import build_pack

    cells = [SimpleNamespace(id=f"m{k}", config=c) for k, c in enumerate(cfgs)]
    pack = build_pack(cells, results_dir=results_dir, device="cpu", update_cells=update_cells)
    if grouped is not None:
        pack.loop.trainer.router.grouped = grouped
    regimes = [recorded_regime() for _ in cells]
    for member, regime in zip(pack.loop.members, regimes):
        member.regime = regime
    models = [pc.model for pc in pack.loop.trainer.cells]
    starts = [tensors(m) for m in models]
    steps = [pack.loop.step() for _ in range(max(c.config.train.steps for c in cells))]
    return [HostRun(ids=regime.ids, rows=[clean_row(row[c.id]) for row in steps if c.id in row], weights=tensors(model),
                    start=start) for c, regime, model, start in zip(cells, regimes, models, starts)]


def train_pack_of_one(cfg: Any, results_dir: str | Path) -> HostRun:
    """The same cell as a pack of one."""
    return train_pack([cfg], results_dir)[0]


def worst_gaps(solo: HostRun, pack: HostRun) -> dict:
    """The largest absolute difference of every metric (over the steps) and of the adapter (over its tensors)."""
    gaps: dict[str, float] = {}
    for s, p in zip(solo.rows, pack.rows):
        for k in s.keys() & p.keys():
            gaps[k] = max(gaps.get(k, 0.0), abs(s[k] - p[k]))
    gaps["adapter"] = max(float((solo.weights[n] - pack.weights[n]).abs().max()) for n in solo.weights)
    return gaps


def assert_same_result(solo: HostRun, pack: HostRun, tol: float = 1e-6) -> None:
    """Identical token ids every step, the same metric names, every metric and the adapter within ``tol``."""
    assert len(solo.ids) == len(pack.ids) == len(solo.rows) == len(pack.rows)
    for i, (s, p) in enumerate(zip(solo.ids, pack.ids)):
        assert s == p, f"step {i + 1}: sampled token ids differ"
    missing = [(i, sorted(s.keys() ^ p.keys())) for i, (s, p) in enumerate(zip(solo.rows, pack.rows))
               if s.keys() != p.keys()]
    assert not missing, f"metrics one host logs and the other does not (step, names): {missing}"
    assert solo.weights.keys() == pack.weights.keys()
    assert any(not torch.equal(pack.weights[n], pack.start[n]) for n in pack.weights), "the cell did not train"
    gaps = worst_gaps(solo, pack)
    over = {k: v for k, v in gaps.items() if not v <= tol}
    assert not over, f"solo vs pack beyond {tol}: {over}"
