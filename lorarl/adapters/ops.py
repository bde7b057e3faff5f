"""What method builders do to a model (imported lazily by `lorarl.adapters.methods`, which stays light):
LoRA initialisations on peft layers, the off-principal masks and their masked optimiser, AdaLoRA's
budget callback. `BuildContext` carries the seed, optimiser settings and SVD cache to them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lorarl.adapters.fingerprint import ADAPTER
from lorarl.adapters.inits import is_residual, lora_init, residual, seeded_generator
from lorarl.adapters.names import SVD_INITS
from lorarl.adapters.svd_cache import SVDCache, model_key, param_digests

PEFT_PREFIX = "base_model.model."


class BuildContext:
    """What builders need besides the adapter settings: seed, optimiser settings, the SVD cache."""

    def __init__(self, seed: int = 0, lr: float = 1e-3, weight_decay: float = 0.0, total_steps: int = 1,
                 svd_root: str | Path | None = None, betas: tuple[float, float] = (0.9, 0.999)):
        self.seed = seed
        self.lr = lr
        self.weight_decay = weight_decay
        self.betas = betas  # AdamW's moment decays (train.adam_beta2) for a method's own optimiser
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
                         gen=seeded_generator(ctx.seed, name), low_alpha=a.get("mask_low_alpha")).to(W.device)
        W.register_hook(lambda g, m=mask: g.masked_fill(~m, 0))
        ctx.masks[name] = (W, mask)


class MaskedAdamW(torch.optim.AdamW):
    """AdamW in which frozen entries of masked weights never move: their gradient is zeroed (so Adam's
    moments stay 0 and the update is exactly 0) and decoupled weight decay touches trained entries only."""

    @classmethod
    def for_model(cls, model: torch.nn.Module, masks: dict, lr: float, weight_decay: float,
                  betas: tuple[float, float] = (0.9, 0.999)) -> "MaskedAdamW":
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
        opt = cls([g for g in param_groups if g["params"]], lr=lr, betas=betas, eps=1e-8)
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
