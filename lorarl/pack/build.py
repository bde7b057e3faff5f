"""Build a pack from cells: one base, K adapters sharing its frozen weights, one step loop.

    pack = build_pack(cells, results_dir="results", device="cpu")
    pack.loop.step()  # full GRPO step of every member

Each cell gets the parts the solo trainer (:mod:`lorarl.train.prepare`) gives it, from the same project pieces:
its adapter from the registry (:func:`lorarl.adapters.build_adapter`, seeded by the cell's seed), its
regime (:func:`lorarl.rewards.registry.build_regime`), AdamW with its lr and weight decay, HF's schedule of its
``train.lr_scheduler`` / ``warmup_ratio``, gradient clipping at 1.0 (HF's default), its own data-order
and sampling generators (seeded from the cell's seed). The cells' models share ONE copy of the frozen
base weights (a deep copy whose memo maps every base parameter to itself); the frozen KL reference
is one copy of the original base for the whole pack. Residual inits (PiSSA, MiLoRA, OLoRA, OLoRA-tail)
pack too: their residual W0 − s·B0A0 is a function of the model, rank, alpha, init and targets (all in
the pack key; the SVD inits draw no random numbers), so every member writes the same residual into
the shared base, each from W0 (restored before each member's init); the result is checked bit for bit.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lorarl.pack.generate import SampleSettings
from lorarl.pack.loss import LossSettings
from lorarl.pack.steps import Member, PackLoop
from lorarl.pack.trainer import PackCell, PackedTrainer
from lorarl.train.streams import DataOrder, sampling_generator


@dataclass
class Pack:
    """A built pack: the step loop plus what the runner saves per cell."""

    loop: PackLoop
    policies: list[Any]  # lorarl.adapters.AdaptedPolicy per cell (save, fingerprint, mlflow tags)
    tokenizer: Any
    precision: str
    data_facts: dict


@dataclass
class Door:
    """What every pack of one compatible group shares, loaded once and kept across a resident job's re-forms
    (lorarl.pack.resident): the base and tokenizer, the adapted weights' original values (a residual init rewrites
    them in place), the frozen KL reference, the prompts and answers, and the reward regimes (a teacher's or PRM's
    model). The base itself is never wrapped: every member adapts a copy that shares its weights. Without a door,
    :func:`build_pack` opens one for that pack alone."""

    key: Any = None  # (compatibility key, device, results dir): what the pieces were loaded for
    base: Any = None
    tok: Any = None
    precision: str = ""
    originals: dict | None = None  # W0 of the adapted weights (residual inits), captured at load
    ref: Any = None  # built on first need (a later member may need the KL reference when the first did not)
    texts: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    answers: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    regimes: dict = field(default_factory=dict)  # (reward config, temperature) -> (regime, grading settings)
    loads: int = 0  # how many times the base was loaded (a resident job's re-forms load none)

    def open(self, cells: list[Any], results_dir: str | Path, device: str) -> None:
        """Load the pieces for ``cells`` unless this door already holds them."""
        from lorarl.numerics.precision import resolve_precision
        from lorarl.pack.plan import pack_key
        from lorarl.tasks.prompt import prompt_ids, prompt_keep, prompt_text
        from lorarl.tasks.trainset import training_dataset
        from lorarl.train.prepare import load_policy, start_grading
        from lorarl.train.prompt_fit import keep_last

        cfg0 = cells[0].config
        key = (pack_key(cfg0, lengths=False), device, str(results_dir))
        if key == self.key:
            _restore(self.originals)  # the previous pack's residual init left W0 - s·B0A0 in the shared weights
            return
        precision = resolve_precision(cfg0.train.precision, device)
        for c in cells:  # the grading workers start beside the base's load (a started pool: nothing more)
            start_grading(c.config)
        base, tok = load_policy(cfg0, results_dir, device, precision)  # the door's pieces (lorarl.train.prepare)
        dataset, facts = training_dataset(cfg0, tok)
        prompts = list(dataset["prompt"])
        vars(self).update(vars(Door(  # a new group: nothing of the previous one is kept
            key=key, base=base, tok=tok, precision=precision, facts=facts, loads=self.loads + 1,
            originals=_residual_originals(base, cfg0),
            ids=[keep_last(prompt_ids(tok, p, cfg0.prompt), prompt_keep(cfg0.train)) for p in prompts],  # prompt_overflow
            texts=[prompt_text(tok, p, cfg0.prompt) for p in prompts], answers=[str(a) for a in dataset["answer"]])))

    def reference(self, needed: bool) -> Any:
        """One frozen copy of the original base for every pack (None while no member needs it)."""
        from lorarl.numerics.kl import reference_of

        if needed and self.ref is None:
            self.ref = reference_of(self.base, self.precision, True)
        return self.ref if needed else None

    def regime(self, cfg: Any, results_dir: str | Path, device: str) -> tuple[Any, Any]:
        """Cells with one reward config share the regime (one teacher / PRM in memory), in a pack and across packs."""
        from lorarl.train.prepare import reward_of

        rkey = (cfg.reward.model_dump_json(), cfg.train.temperature)  # (a teacher's log-probs use the temperature)
        if rkey not in self.regimes:
            self.regimes[rkey] = reward_of(cfg, self.tok, results_dir, device)  # (regime, grading settings)
        return self.regimes[rkey]


def _int_or_none(value) -> int | None:
    """``rollout.generation_batch_size``: a number of rows, else None (null; "auto" the memory plan has not resolved)."""
    return value if isinstance(value, int) else None


def _share_base(base: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``base`` whose parameters and buffers ARE the base's (no second copy of the weights)."""
    memo = {id(t): t for t in list(base.parameters()) + list(base.buffers())}
    return copy.deepcopy(base, memo)


def _residual_originals(base: torch.nn.Module, cfg: Any) -> dict[torch.Tensor, torch.Tensor] | None:
    """Residual inits (PiSSA, MiLoRA, OLoRA...): the adapted weights' original values (W0), so that each
    cell's init starts from W0 (its SVD, cached, is of W0) and writes the same residual; else None."""
    from lorarl.adapters.inits import is_residual
    from lorarl.adapters.ops import target_linears

    if not is_residual(cfg.adapter.init):
        return None
    targets = cfg.adapter.target_modules or "all-linear"
    return {m.weight: m.weight.detach().to("cpu", copy=True) for _, m in target_linears(base, targets)}  # host memory


def _restore(originals: dict[torch.Tensor, torch.Tensor] | None) -> None:
    with torch.no_grad():
        for w, w0 in (originals or {}).items():
            w.copy_(w0)


def _digest(originals: dict[torch.Tensor, torch.Tensor] | None) -> str | None:
    """A digest of the shared adapted weights as they are now (the residual base after a residual init)."""
    import hashlib

    if not originals:
        return None
    h = hashlib.sha256()
    for w in originals:
        h.update(w.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def pack_micro_batch(cells: list[Any]) -> int | None:
    """Rows of each cell per forward/backward: the smallest ``train.micro_batch_size`` a member sets (a
    runtime knob; None when no member sets a number)."""
    from lorarl.train.microbatch import micro_size

    sizes = [m for m in (micro_size(c.config.train.micro_batch_size) for c in cells) if m]
    return min(sizes) if sizes else None


def pack_micro_tokens(cells: list[Any]) -> int | None:
    """Token positions of each cell's chunk per forward/backward: the smallest ``train.micro_batch_tokens`` a
    member sets (a runtime knob; None when no member sets one; it wins over ``pack_micro_batch``)."""
    budgets = [c.config.train.micro_batch_tokens for c in cells if c.config.train.micro_batch_tokens]
    return min(budgets) if budgets else None


def _checkpoint_base(host: torch.nn.Module) -> None:
    """Activation checkpointing on the pack's shared base (non-reentrant: no input grads needed)."""
    base = host.get_base_model() if hasattr(host, "get_base_model") else host
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_pack(cells: list[Any], results_dir: str | Path = "results", device: str = "cpu",
               update_cells: int | None = None, llm: Any = None, door: Door | None = None) -> Pack:
    """Cells (``lorarl.language.study.Cell``, same compatibility key) → a ready :class:`Pack`. ``update_cells``:
    cells per forward/backward of the update (None: all at once; same result, less memory when smaller).
    ``rollout.engine: vllm``: the members sample through one multi-LoRA engine (``llm``, else the process's,
    :func:`lorarl.pack.vllm_rollouts.pack_engine`). ``door``: the shared pieces, kept across calls (a resident
    job's re-forms); None: loaded for this pack alone."""
    from transformers import get_scheduler

    from lorarl.adapters import build_adapter
    from lorarl.numerics.invariant import trainer_kernels
    from lorarl.numerics.kl import needs_reference
    from lorarl.stop_ids import stop_token_ids
    from lorarl.train.trl_args import adamw, checkpointing

    from lorarl.pack.plan import pack_key

    if not cells:
        raise ValueError("a pack needs at least one cell")
    keys = {pack_key(c.config, lengths=False) for c in cells}  # members may differ in train.steps (each its own)
    if None in keys or len(keys) != 1:
        raise ValueError("cells of a pack must share one compatibility key (lorarl.pack.plan.pack_key): "
                         + ", ".join(c.id for c in cells))
    cfg0 = cells[0].config
    door = door if door is not None else Door()
    door.open(cells, results_dir, device)
    base, tok, precision, originals = door.base, door.tok, door.precision, door.originals
    ref = door.reference(any(needs_reference(c.config.train.beta, c.config.train.kl_monitor_every) for c in cells))
    texts, ids, answers = door.texts, door.ids, door.answers
    models = [_share_base(base) for _ in cells]  # the door's base stays unwrapped: the next pack adapts it again
    pcs, members, policies = [], [], []
    residual_digest = None
    for k, cell in enumerate(cells):
        cfg, t = cell.config, cell.config.train
        model = models[k]
        _restore(originals)  # a residual init writes W0 - s·B0A0 into the ONE shared base: from W0 each time
        torch.manual_seed(cfg.seed)  # the adapter's init stream, as the solo trainer's (lorarl.train.prepare.load_policy)
        policy = build_adapter(model, cfg, results_dir=results_dir, precision=precision)
        digest = _digest(originals)
        if residual_digest is not None and digest != residual_digest:
            raise ValueError(f"cell {cell.id}: its residual base differs from cell {cells[0].id}'s; cells of a "
                             "pack must share their (residual) base bit for bit")
        residual_digest = digest
        params = [p for p in policy.model.parameters() if p.requires_grad]
        opt = policy.optimizer or adamw(params, t)  # the solo job's optimiser (HF's Trainer's, lorarl.train.trl_args)
        sched = get_scheduler(t.lr_scheduler, opt, num_warmup_steps=math.ceil(t.warmup_ratio * t.steps),
                              num_training_steps=t.steps)
        pcs.append(PackCell(cell.id, policy.model, opt, LossSettings.from_train(t), sched, max_grad_norm=t.max_grad_norm))
        regime, grading = door.regime(cfg, results_dir, device)
        members.append(Member(
            name=cell.id, regime=regime, prompts=texts, prompt_ids=ids, answers=answers,
            order=DataOrder(len(ids), cfg.seed), sampler=sampling_generator(cfg.seed),
            steps=t.steps, prompts_per_step=t.prompts_per_step, generations=t.generations, beta=t.beta,
            scale_rewards=t.scale_rewards != "none", kl_monitor_every=t.kl_monitor_every,
            overlong_buffer=t.overlong_buffer, overlong_factor=t.overlong_factor, grading=grading))
        policies.append(policy)
    invariant = any(c.config.runtime.batch_invariant for c in cells)  # one member asks: the whole pack runs so
    trainer_kernels(invariant, torch.device(device).type)  # a GPU's batch-invariant kernels (lorarl.numerics.invariant)
    eos_ids = stop_token_ids(base, tok)  # the generation config's EOS ids too (<end_of_turn>), as solo training
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    sample = SampleSettings(prompt_width=max(len(x) for x in ids), max_new_tokens=cfg0.train.max_completion_length,
                            temperature=tuple(c.config.train.temperature for c in cells),
                            top_p=tuple(c.config.train.top_p for c in cells), pad_token_id=int(pad),
                            eos_token_ids=tuple(int(e) for e in eos_ids),
                            generation_batch_size=_int_or_none(cfg0.rollout.generation_batch_size),
                            engine=cfg0.runtime.generation, batch_invariant=invariant)
    trainer = PackedTrainer(pcs, pad_token_id=int(pad), fused_lm_head=False,
                            temperature=[c.config.train.temperature for c in cells],
                            update_cells=update_cells, micro_batch_size=pack_micro_batch(cells),
                            micro_batch_tokens=pack_micro_tokens(cells),
                            trl_head=True,  # the solo job's log-prob head (TRL's kernel), per cell
                            batch_invariant=invariant)
    if any(checkpointing(c.config.train.gradient_checkpointing, use_cpu=device == "cpu") for c in cells):
        _checkpoint_base(trainer.host)
    rollouts = None
    if cfg0.rollout.engine == "vllm":
        from lorarl.models import resolve_model
        from lorarl.numerics.invariant import vllm_engine_env
        from lorarl.pack.vllm_rollouts import VLLMRollouts

        vllm_engine_env(invariant)  # vLLM's own batch-invariant switch, before the engine starts

        rollouts = VLLMRollouts.build(cells, policies, [p.model for p in policies],
                                      str(resolve_model(cfg0.model, results_dir)), sample, llm=llm)
    return Pack(PackLoop(trainer, members, sample, tok, ref, rollouts), policies, tok, precision, door.facts)
