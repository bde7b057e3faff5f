"""Cell config → adapted policy: the model to train, its optimiser and callbacks, and its fingerprint.

    policy = build_adapter(model, cell_config, results_dir="results")
    trainer = GRPOTrainer(model=policy.model, peft_config=None, optimizers=(policy.optimizer, None),
                          callbacks=[..., *policy.callbacks], ...)
    counts = policy.verify(trainer.model)     # raises AdapterMismatch if the trainer changed the adapter
    ...train...
    policy.save(work / "adapter", trainer.model)

Invariant (tests/test_adapters.py): at step 0 the adapted model computes exactly the base model's
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
from lorarl.adapters.inits import is_residual, lora_init, residual, seeded_generator
from lorarl.adapters.names import SVD_INITS
from lorarl.adapters.registry import check_config, get_method
from lorarl.adapters.svd_cache import SVDCache, model_key, param_digests

PEFT_PREFIX = "base_model.model."


class BuildContext:
    """What builders need besides the adapter settings: seed, optimiser settings, the SVD cache."""

    def __init__(self, seed: int = 0, lr: float = 1e-3, weight_decay: float = 0.0, total_steps: int = 1,
                 svd_root: str | Path | None = None):
        self.seed = seed
        self.lr = lr
        self.weight_decay = weight_decay
        self.total_steps = total_steps
        self.svd_root = svd_root
        self.digests: dict[str, str] | None = None
        self.cache: SVDCache | None = None
        self.masks: dict[str, tuple[torch.nn.Parameter, torch.Tensor]] = {}  # name -> (param, trainable mask)
        self.init_factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # residual inits: (A0, B0)

    def prepare_svd(self, model: torch.nn.Module) -> None:
        """Digest the ORIGINAL weights (before any residual is written) and open the cache."""
        self.digests = param_digests(model)
        self.cache = SVDCache(self.svd_root, model_key(digests=self.digests))

    def spectrum(self, module_name: str, W: torch.Tensor, need: int):
        if self.cache is None:
            raise RuntimeError("prepare_svd(model) must run before the model is modified")
        return self.cache.get(module_name, W, need, digest=self.digests.get(module_name + ".weight"))


def _original_name(peft_module_name: str) -> str:
    return peft_module_name[len(PEFT_PREFIX):] if peft_module_name.startswith(PEFT_PREFIX) else peft_module_name


def apply_lora_init(pm: Any, init: str, ctx: BuildContext, dora: bool = False) -> None:
    """Write (A0, B0) of `init` into every LoRA layer of the default adapter; for residual inits write
    W0 − s·B0A0 into the base weight (computed from the adapter values as stored, so the sum is W0
    to rounding); for DoRA set the magnitude to the row norms of the step-0 weight (so m/||W|| = 1)."""
    from peft.tuners.lora import LoraLayer

    for name, mod in pm.named_modules():
        if not isinstance(mod, LoraLayer) or ADAPTER not in mod.lora_A:
            continue
        base = mod.get_base_layer()
        if not isinstance(base, torch.nn.Linear):
            raise TypeError(f"{name}: inits are defined for nn.Linear weights, got {type(base).__name__}")
        W = base.weight
        m, n = W.shape
        r, s = mod.r[ADAPTER], mod.scaling[ADAPTER]
        orig = _original_name(name)
        try:
            spec = ctx.spectrum(orig, W, r) if init in SVD_INITS else None
            B0, A0 = lora_init(init, m, n, r, spectrum=spec, gen=seeded_generator(ctx.seed, orig), scale=s)
        except ValueError as err:
            raise ValueError(f"adapter.init={init!r} on {orig} ({m}x{n}, rank {r}): {err}") from None
        A, B = mod.lora_A[ADAPTER].weight, mod.lora_B[ADAPTER].weight
        with torch.no_grad():
            A.copy_(A0.to(A.device, A.dtype))
            B.copy_(B0.to(B.device, B.dtype))
            if is_residual(init):
                W.copy_(residual(W, B, A, s))
                ctx.init_factors[name] = (A.detach().cpu().clone(), B.detach().cpu().clone())
            if dora:
                mag = mod.lora_magnitude_vector[ADAPTER]
                lw = mag.get_lora_weight(mod.lora_A[ADAPTER], mod.lora_B[ADAPTER])
                norm = mag.get_weight_norm(W.to(lw.dtype), lw, s)
                mag.weight.copy_(norm.to(mag.weight.dtype))


def target_linears(model: torch.nn.Module, targets: str | list[str]) -> list[tuple[str, torch.nn.Linear]]:
    """nn.Linear modules named by `targets`: "all-linear" = every Linear but the output head (peft's
    rule); a list = modules whose name is, or ends with '.', one of the entries."""
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    wanted = None if targets == "all-linear" else ([targets] if isinstance(targets, str) else list(targets))
    found = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or mod is out_emb:
            continue
        if wanted is None or any(name == t or name.endswith("." + t) for t in wanted):
            found.append((name, mod))
    if not found:
        raise ValueError(f"target_modules={targets!r} matches no nn.Linear in the model")
    return found


def apply_masks(model: torch.nn.Module, a: dict, ctx: BuildContext) -> None:
    """Compute the trainable mask of each target weight and zero the gradient outside it."""
    from lorarl.adapters.masks import NEEDS_SVD, make_mask

    kind = a["mask"]
    for name, mod in target_linears(model, a["target_modules"]):
        W = mod.weight
        spec = ctx.spectrum(name, W, a["mask_rank"]) if kind in NEEDS_SVD else None
        mask = make_mask(kind, W, alpha=a["mask_alpha"], k=a["mask_rank"], spectrum=spec,
                         gen=seeded_generator(ctx.seed, name)).to(W.device)
        W.register_hook(lambda g, m=mask: g.masked_fill(~m, 0))
        ctx.masks[name] = (W, mask)


class MaskedAdamW(torch.optim.AdamW):
    """AdamW in which frozen entries of masked weights never move: their gradient is zeroed (so Adam's
    moments stay 0 and the update is exactly 0) and decoupled weight decay touches trained entries only."""

    @classmethod
    def for_model(cls, model: torch.nn.Module, masks: dict, lr: float, weight_decay: float) -> "MaskedAdamW":
        from transformers.trainer_pt_utils import get_parameter_names

        decay = set(get_parameter_names(model, [torch.nn.LayerNorm],
                                        [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)",
                                         r"_norm(?:$|\.)"]))
        masked = {id(p): m for p, m in masks.values()}
        groups: dict[str, list] = {"decay": [], "no_decay": [], "masked": []}
        seen = set()
        for n, p in model.named_parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            groups["masked" if id(p) in masked else ("decay" if n in decay else "no_decay")].append(p)
        param_groups = [
            {"params": groups["decay"], "weight_decay": weight_decay},
            {"params": groups["no_decay"], "weight_decay": 0.0},
            {"params": groups["masked"], "weight_decay": 0.0, "masked_weight_decay": weight_decay},
        ]
        opt = cls([g for g in param_groups if g["params"]], lr=lr, betas=(0.9, 0.999), eps=1e-8)
        opt.masks = masked
        return opt

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            wd = group.get("masked_weight_decay", 0.0)
            for p in group["params"]:
                m = getattr(self, "masks", {}).get(id(p))
                if m is None:
                    continue
                if p.grad is not None:
                    p.grad.masked_fill_(~m, 0)
                if wd:
                    p.mul_(torch.where(m, 1.0 - group["lr"] * wd, 1.0).to(p.dtype))
        return super().step(closure)


def _trainer_callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class AdaLoraCallback(_trainer_callback_base()):
    """AdaLoRA inside a stock trainer: peft adds the orthogonality penalty only when the forward gets
    labels (GRPO's does not) and expects `update_and_allocate` after every optimiser step. This adds
    ∇(w·R) to the gradients just before the step (after clipping) and runs the budget allocation
    after it, before zero_grad."""

    def _peft(self, model):
        return model if hasattr(model, "base_model") else None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        pm = self._peft(model)
        if pm is None:
            return
        cfg = pm.peft_config[ADAPTER]
        w = cfg.orth_reg_weight
        if w <= 0:
            return
        params = [(n, p) for n, p in pm.named_parameters()
                  if ("lora_A" in n or "lora_B" in n) and f".{ADAPTER}" in n and p.requires_grad]
        if not params:
            return
        with torch.enable_grad():
            reg = 0.0
            for n, p in params:
                cov = p @ p.T if "lora_A" in n else p.T @ p
                eye = torch.eye(*cov.shape, device=cov.device, dtype=cov.dtype)
                reg = reg + torch.linalg.matrix_norm(cov - eye)
            (w * reg / len(params)).backward()

    def on_optimizer_step(self, args, state, control, model=None, **kw):
        pm = self._peft(model)
        if pm is not None:
            pm.base_model.update_and_allocate(state.global_step)


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

    def save(self, path: str | Path, model: Any | None = None) -> Path:
        """Save what evaluation loads on the ORIGINAL base: the adapter (residual inits converted to a
        plain rank-2r adapter) or, for full fine-tuning, the model; plus `lorarl_adapter.json`."""
        model = model if model is not None else self.model
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.ctx is not None and self.ctx.init_factors:
            _save_residual_converted(model, self.ctx.init_factors, path)
        else:
            model.save_pretrained(path)
        meta = {"fingerprint": self.fingerprint,
                "residual_converted": bool(self.ctx and self.ctx.init_factors)}
        tmp = path / "lorarl_adapter.json.tmp"
        tmp.write_text(json.dumps(jsonable(meta), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path / "lorarl_adapter.json")
        return path


def _save_residual_converted(model: Any, init_factors: dict, path: Path) -> None:
    """ΔW relative to the original W0 is s(BA − B0A0) = s [B, −B0] [A; A0]: save that as a rank-2r
    LoRA with the same scale (alpha doubled, or ×√2 for rsLoRA, as peft's own PiSSA conversion)."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    sd = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}
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
    save_file(sd, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(path))


def build_adapter(model: torch.nn.Module, cfg: Any, *, results_dir: str | Path | None = None,
                  svd_root: str | Path | None = None, keep_reference: bool = False,
                  precision: str | None = None) -> AdaptedPolicy:
    """Apply `cfg.adapter` (a CellConfig) to `model` in place and return the AdaptedPolicy.

    `precision` (a resolved `train.precision`, lorarl.train.precision): the trainable tensors are cast to
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
    ctx = BuildContext(seed=cfg.seed, lr=t.lr, weight_decay=t.weight_decay, total_steps=t.steps, svd_root=svd_root)
    if applied.get("init") in SVD_INITS or applied.get("mask") not in (None, "low_magnitude"):
        ctx.prepare_svd(model)
    built = method.build(model, applied, ctx)
    if precision is not None:
        from lorarl.train.precision import cast_trainable

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
