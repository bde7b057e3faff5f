"""Cell config → adapted policy: the model to train, its optimiser and callbacks, and its fingerprint.

    policy = build_adapter(model, cell_config, results_dir="results")
    trainer = GRPOTrainer(model=policy.model, peft_config=None, optimizers=(policy.optimizer, None),
                          callbacks=[..., *policy.callbacks], ...)
    counts = policy.verify(trainer.model)     # raises AdapterMismatch if the trainer changed the adapter
    ...train...
    policy.save(work / "adapter", trainer.model)

Invariant (tests/adapters/test_adapters.py): at step 0 the adapted model computes exactly the base model's
function for every method × init. Residual inits write W0 − s·B0A0 into the frozen base weight, so the
*reference policy must be a frozen copy of the original base* (`keep_reference=True` gives one),
never "the peft model with the adapter disabled". `save` converts a residual-init adapter into a
plain one relative to the ORIGINAL base (rank 2r: A' = [A; A0], B' = [B, −B0], same scale), so any
loader that puts the saved adapter on the original model gets the trained policy.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lorarl.adapters.fingerprint import (ADAPTER, AdapterMismatch, applied_peft_config, checksum, jsonable,
                                         observe)
from lorarl.adapters.names import SVD_INITS
from lorarl.adapters.catalog import check_config, get_method
from lorarl.adapters.ops import BuildContext

def _optimizer_facts(opt: Any, model: Any) -> dict:
    if opt is None:
        return {"class": "trainer default (AdamW)"}
    facts: dict[str, Any] = {"class": type(opt).__name__, "groups": len(opt.param_groups)}
    names = {id(p): n for n, p in model.named_parameters()}
    lrs: dict[str, float] = {}
    for g in opt.param_groups:
        for p in g["params"]:
            n = names.get(id(p), "")
            for k in ("lora_A", "lora_B"):
                if f"{k}." in n and p.requires_grad:
                    lrs.setdefault(k, g["lr"])
    facts["group_lrs"] = lrs
    return facts


@dataclass
class AdaptedPolicy:
    """The result of `build_adapter`. `model` is what the trainer trains."""

    model: Any
    method: str
    applied: dict
    optimizer: Any = None
    callbacks: list = field(default_factory=list)
    fingerprint: dict = field(default_factory=dict)
    reference: Any = None  # frozen copy of the original base (keep_reference=True), else None
    ctx: BuildContext | None = None

    def counts(self) -> dict[str, float]:
        fp = self.fingerprint
        return {k: fp[k] for k in ("params_total", "params_trainable", "trainable_fraction")}

    def verify(self, model: Any | None = None) -> dict[str, float]:
        """Re-observe the model (e.g. after the trainer wrapped it) and fail if the adapter's initial
        weights or the trainable set changed; return the build-time parameter counts."""
        model = model if model is not None else self.model
        masks = self.ctx.masks if self.ctx else None
        now = checksum(model, masks)
        problems = []
        if now != self.fingerprint["init_checksum"]:
            problems.append(f"initial adapter checksum changed: {self.fingerprint['init_checksum']} -> {now}")
        obs = observe(model, masks)
        if obs["params_trainable"] != self.fingerprint["params_trainable"]:
            problems.append(f"trainable parameters changed: {self.fingerprint['params_trainable']} -> "
                            f"{obs['params_trainable']}")
        if obs["peft_type"] != self.fingerprint["peft_type"]:
            problems.append(f"peft type changed: {self.fingerprint['peft_type']} -> {obs['peft_type']}")
        if problems:
            raise AdapterMismatch(f"adapter of method {self.method!r} changed after build: " + "; ".join(problems))
        return self.counts()

    def attach(self, trainer: Any) -> dict[str, float]:
        """Hand the method's optimiser (LoRA+, LoRA-FA, masked AdamW) and callbacks (AdaLoRA) to a
        constructed HF/TRL trainer (same effect as `optimizers=(opt, None)`), then `verify` its model.
        Returns the build-time parameter counts."""
        if self.optimizer is not None:
            if getattr(trainer, "optimizer", None) not in (None, self.optimizer):
                raise AdapterMismatch(f"method {self.method!r} needs its own optimiser but the trainer already "
                                      f"has {type(trainer.optimizer).__name__}")
            trainer.optimizer = self.optimizer
            trainer.callback_handler.optimizer = self.optimizer
        for cb in self.callbacks:
            trainer.add_callback(cb)
        return self.verify(trainer.model)

    def mlflow_tags(self) -> dict[str, str]:
        fp = self.fingerprint
        return {
            "adapter.method": self.method,
            "adapter.init": str(self.applied.get("init")),
            "adapter.peft_type": str(fp.get("peft_type")),
            "adapter.init_checksum": fp["init_checksum"],
            "adapter.optimizer": fp["optimizer"]["class"],
            "adapter.applied": json.dumps(jsonable(self.applied), sort_keys=True)[:5000],
            "adapter.peft_config": json.dumps(fp.get("peft_config"), sort_keys=True)[:5000],
        }

    def save(self, path: str | Path, model: Any | None = None, state_dict: dict | None = None) -> Path:
        """Save what evaluation loads on the ORIGINAL base: the adapter (residual inits converted to a
        plain rank-2r adapter) or, for full fine-tuning, the model; plus `lorarl_adapter.json`.
        ``state_dict``: the full weights gathered from a sharded model (lorarl.train.sharding)."""
        model = model if model is not None else self.model
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.ctx is not None and self.ctx.init_factors:
            _save_residual_converted(model, self.ctx.init_factors, path, state_dict)
        else:
            model.save_pretrained(path, state_dict=state_dict)  # None: the model's own
        meta = {"fingerprint": self.fingerprint,
                "residual_converted": bool(self.ctx and self.ctx.init_factors)}
        tmp = path / "lorarl_adapter.json.tmp"
        tmp.write_text(json.dumps(jsonable(meta), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path / "lorarl_adapter.json")
        return path


def adapter_state(policy: AdaptedPolicy, model: Any | None = None,
                  out: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """What ``policy.save`` writes for a LoRA-family adapter, in memory: (``adapter_model.safetensors``'s tensors,
    detached CPU copies; ``adapter_config.json`` as a dict), residual inits converted as there. For a pack's
    vLLM engine (lorarl.pack.vllm_rollouts: no file per step). ``out``: tensors of an earlier call to copy into
    (same names and shapes: no new memory, whose first touch costs more than the copy), else new ones."""
    from peft.utils import get_peft_model_state_dict

    model = model if model is not None else policy.model
    if policy.ctx is not None and policy.ctx.init_factors:
        sd, cfg = _residual_converted(model, policy.ctx.init_factors)
    else:
        live = get_peft_model_state_dict(model, adapter_name=ADAPTER)
        cfg = model.peft_config[ADAPTER]
        if out is not None and out.keys() == live.keys() and all(
                out[k].shape == v.shape and out[k].dtype == v.dtype for k, v in live.items()):
            sd = {k: out[k].copy_(v.detach()) for k, v in live.items()}
        else:
            sd = {k: v.detach().cpu().clone() for k, v in live.items()}
    return sd, json.loads(json.dumps(cfg.to_dict(), default=sorted))  # sets (target_modules) as lists, as on disk


def _save_residual_converted(model: Any, init_factors: dict, path: Path, state_dict: dict | None = None) -> None:
    """ΔW relative to the original W0 is s(BA − B0A0) = s [B, −B0] [A; A0]: save that as a rank-2r
    LoRA with the same scale (alpha doubled, or ×√2 for rsLoRA, as peft's own PiSSA conversion).
    ``state_dict``: the model's full weights gathered from its shards (FSDP2), else read from the model."""
    from safetensors.torch import save_file

    sd, cfg = _residual_converted(model, init_factors, state_dict)
    save_file(sd, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(path))


def _residual_converted(model: Any, init_factors: dict, state_dict: dict | None = None) -> tuple[dict, Any]:
    """The converted rank-2r adapter of :func:`_save_residual_converted`: (state dict, peft config)."""
    from peft.utils import get_peft_model_state_dict

    sd = {k: v.detach().cpu().clone()
          for k, v in get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=ADAPTER).items()}
    for name, (A0, B0) in init_factors.items():
        key_a, key_b = f"{name}.lora_A.weight", f"{name}.lora_B.weight"
        if key_a not in sd or key_b not in sd:
            raise KeyError(f"adapter state dict lacks {key_a} / {key_b}")
        A, B = sd[key_a], sd[key_b]
        sd[key_a] = torch.cat([A, A0.to(A.dtype)], dim=0).contiguous()
        sd[key_b] = torch.cat([B, -B0.to(B.dtype)], dim=1).contiguous()
    cfg = copy.deepcopy(model.peft_config[ADAPTER])
    cfg.r *= 2
    cfg.lora_alpha = cfg.lora_alpha * (2 ** 0.5 if cfg.use_rslora else 2)
    cfg.init_lora_weights = True
    cfg.inference_mode = True
    if cfg.base_model_name_or_path is None:
        cfg.base_model_name_or_path = getattr(model.base_model.model, "name_or_path", None)
    return sd, cfg


def build_adapter(model: torch.nn.Module, cfg: Any, *, results_dir: str | Path | None = None,
                  svd_root: str | Path | None = None, keep_reference: bool = False,
                  precision: str | None = None) -> AdaptedPolicy:
    """Apply `cfg.adapter` (a CellConfig) to `model` in place and return the AdaptedPolicy.

    `precision` (a resolved `train.precision`, lorarl.numerics.precision): the trainable tensors are cast to
    their master dtype before the optimiser is built (None: left as built).
    The SVD cache lives in `svd_root`, default `<results_dir>/svd_cache`, in memory if neither is given.
    Raises AdapterMismatch if the built model does not match the requested method/init.
    """
    applied = check_config(cfg.adapter.model_dump())
    method = get_method(applied["method"])
    reference = None
    if keep_reference:
        reference = copy.deepcopy(model).eval()
        reference.requires_grad_(False)
    if svd_root is None and results_dir is not None:
        svd_root = Path(results_dir) / "svd_cache"
    t = cfg.train
    ctx = BuildContext(seed=cfg.seed, lr=t.lr, weight_decay=t.weight_decay, total_steps=t.optimizer_updates, svd_root=svd_root,
                       betas=(0.9, t.adam_beta2))
    if applied.get("init") in SVD_INITS or applied.get("mask") not in (None, "low_magnitude"):
        ctx.prepare_svd(model)
    built = method.build(model, applied, ctx)
    if precision is not None:
        from lorarl.numerics.precision import cast_trainable

        cast_trainable(built, precision)
    optimizer = method.make_optimizer(built, applied, ctx)
    callbacks = method.make_callbacks(built, applied, ctx)
    obs = observe(built, ctx.masks or None)
    obs["optimizer"] = _optimizer_facts(optimizer, built)
    problems = method.expect(obs, applied)
    if problems:
        raise AdapterMismatch(f"method {method.name!r} (init {applied.get('init')!r}) was not built as "
                              f"requested: " + "; ".join(problems))
    fp = {
        "method": method.name, "init": applied.get("init"), "applied": applied,
        "peft_type": obs["peft_type"], "peft_config": applied_peft_config(built),
        "params_total": obs["params_total"], "params_trainable": obs["params_trainable"],
        "trainable_fraction": obs["trainable_fraction"],
        "init_checksum": checksum(built, ctx.masks or None),
        "optimizer": obs["optimizer"],
        "structure": {k: v for k, v in obs.items() if k in ("kinds", "lora_scalings", "lora_ranks", "lora_layers",
                                                            "init_stats", "masks")},
        "residual_layers": len(ctx.init_factors),
    }
    if ctx.cache is not None:
        fp["svd_cache"] = {"model_key": ctx.cache.key, "dir": str(ctx.cache.dir) if ctx.cache.dir else None,
                           **ctx.cache.stats}
    return AdaptedPolicy(model=built, method=method.name, applied=applied, optimizer=optimizer,
                         callbacks=callbacks, fingerprint=jsonable(fp), reference=reference, ctx=ctx)
