"""Every `adapter.method`, registered by name. peft's own classes and optimisers are used wherever peft
has them; what peft lacks (the init-study inits, the residual bookkeeping, sparse masks, AdaLoRA's
schedule inside a TRL trainer) lives in this package.

Import-light: torch/peft/transformers are imported inside the methods, so `lorarl.config` can load
the registry to validate cells.
"""

from __future__ import annotations

import math
from typing import Any

from lorarl.adapters.names import INITS, MASKS, RESIDUAL_INITS
from lorarl.adapters.registry import Method, register

ADAM_BETAS = (0.9, 0.999)  # transformers.TrainingArguments defaults (what the stock trainer uses)
ADAM_EPS = 1e-8


def _two_rank(v: dict) -> float:
    """2 x rank"""
    return 2.0 * v["rank"]


LORA_FIELDS = ("rank", "alpha", "dropout", "target_modules", "init")
LORA_DEFAULTS = {"rank": 8, "alpha": _two_rank, "dropout": 0.0, "target_modules": "all-linear", "init": "kaiming"}


def _expect_kinds(obs: dict, present: tuple[str, ...], absent: tuple[str, ...] = ()) -> list[str]:
    out = []
    kinds = obs.get("kinds", {})
    for k in present:
        if not kinds.get(k, {}).get("tensors"):
            out.append(f"no `{k}` tensors in the model")
    for k in absent:
        if kinds.get(k, {}).get("tensors"):
            out.append(f"unexpected `{k}` tensors in the model")
    return out


def _expect_peft(obs: dict, peft_type: str) -> list[str]:
    if obs.get("peft_type") != peft_type:
        return [f"peft type is {obs.get('peft_type')!r}, expected {peft_type!r}"]
    return []


def _expect_trainable(obs: dict) -> list[str]:
    return [] if obs.get("params_trainable", 0) > 0 else ["nothing is trainable"]


# ----------------------------------------------------------------------------------------------
# LoRA family: lora, dora, rslora, lora_plus, lora_fa (all take the init axis)
# ----------------------------------------------------------------------------------------------


class _LoraFamily(Method):
    peft_type = "LORA"
    fields = LORA_FIELDS
    defaults = LORA_DEFAULTS
    inits = INITS
    use_dora = False
    use_rslora = False
    freeze_A = False

    def scale(self, a: dict) -> float:
        return a["alpha"] / math.sqrt(a["rank"]) if self.use_rslora else a["alpha"] / a["rank"]

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import LoraConfig, get_peft_model

        from lorarl.adapters.ops import apply_lora_init

        cfg = LoraConfig(
            r=a["rank"], lora_alpha=a["alpha"], lora_dropout=a["dropout"], target_modules=a["target_modules"],
            task_type="CAUSAL_LM", use_dora=self.use_dora, use_rslora=self.use_rslora,
            init_lora_weights=False,  # every init is written by apply_lora_init (peft never touches W0)
        )
        pm = get_peft_model(model, cfg)
        apply_lora_init(pm, a["init"], ctx, dora=self.use_dora)
        return pm

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = _expect_peft(obs, "LORA") + _expect_trainable(obs)
        p += _expect_kinds(obs, ("lora_A", "lora_B"))
        p += _expect_kinds(obs, ("lora_magnitude_vector",)) if self.use_dora else \
            _expect_kinds(obs, (), ("lora_magnitude_vector",))
        kinds = obs.get("kinds", {})
        n_layers = obs.get("lora_layers", 0)
        if self.use_dora and kinds.get("lora_magnitude_vector", {}).get("tensors", 0) != n_layers:
            p.append(f"DoRA needs one magnitude vector per adapted layer ({n_layers}), found "
                     f"{kinds.get('lora_magnitude_vector', {}).get('tensors', 0)}")
        if obs.get("lora_ranks") != [a["rank"]]:
            p.append(f"adapter ranks {obs.get('lora_ranks')} != requested rank {a['rank']}")
        want = round(self.scale(a), 8)
        if obs.get("lora_scalings") != [want]:
            kind = "alpha/sqrt(r) (rsLoRA)" if self.use_rslora else "alpha/r"
            p.append(f"adapter scale {obs.get('lora_scalings')} != {kind} = {want}")
        A = kinds.get("lora_A", {})
        if self.freeze_A and A.get("trainable_tensors", 0) != 0:
            p.append("LoRA-FA requires every lora_A frozen; some are trainable")
        if not self.freeze_A and A.get("trainable_tensors", 0) != A.get("tensors", 0):
            p.append("some lora_A are frozen but the method trains A")
        p += expect_init(obs.get("init_stats", {}), a["init"])
        return p


def expect_init(st: dict, init: str) -> list[str]:
    """Check the observed (A0, B0) statistics against the requested init (step 0 only)."""
    L = st.get("layers", 0)
    if not L:
        return ["no LoRA layers to check the init on"]
    p = []

    def need(key: str, want: int, what: str) -> None:
        if st.get(key) != want:
            p.append(f"init {init!r}: expected {what} in {want}/{L} layers, found {st.get(key)}")

    if init in RESIDUAL_INITS:
        need("B_zero", 0, "B0 != 0")
        if init in ("olora", "olora_tail"):
            need("A_orthonormal", L, "A0 A0^T = I")
            need("B_orthonormal", L, "B0^T B0 = I")
        else:
            need("AAT_eq_BTB_diag", L, "A0 A0^T = B0^T B0 = diag(sigma)")
    else:
        need("B_zero", L, "B0 = 0")
        if init in ("rlpo", "rlmo", "dct", "wavelet"):
            need("A_orthonormal", L, "A0 A0^T = I")
        elif init == "kaiming":
            need("A_within_kaiming_bound", L, "|A0| <= 1/sqrt(n)")
            v = st.get("A_var_times_n", float("nan"))
            if not 0.2 <= v <= 0.5:
                p.append(f"init 'kaiming': n*var(A0) = {v:.3g}, expected ~1/3")
        elif init == "gaussian":
            v = st.get("A_var_times_n", float("nan"))
            if not 0.6 <= v <= 1.6:
                p.append(f"init 'gaussian': n*var(A0) = {v:.3g}, expected ~1")
    return p


@register
class Lora(_LoraFamily):
    name = "lora"
    summary = "LoRA: W0 + (alpha/r) B A"


@register
class Dora(_LoraFamily):
    name = "dora"
    summary = "DoRA: magnitude m times direction (W0 + s B A)/||.||, peft use_dora"
    use_dora = True


@register
class RsLora(_LoraFamily):
    name = "rslora"
    summary = "rsLoRA: scale alpha/sqrt(r), peft use_rslora"
    use_rslora = True


@register
class LoraPlus(_LoraFamily):
    name = "lora_plus"
    summary = "LoRA with the LoRA+ optimiser: lr_B = lr_ratio * lr_A (peft create_loraplus_optimizer)"
    fields = LORA_FIELDS + ("lr_ratio",)
    defaults = {**LORA_DEFAULTS, "lr_ratio": 16.0}

    def make_optimizer(self, model: Any, a: dict, ctx: Any) -> Any:
        import torch
        from peft.optimizers import create_loraplus_optimizer

        return create_loraplus_optimizer(
            model, torch.optim.AdamW, lr=ctx.lr, loraplus_lr_ratio=a["lr_ratio"],
            loraplus_weight_decay=ctx.weight_decay, betas=ADAM_BETAS, eps=ADAM_EPS,
        )

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = super().expect(obs, a)
        lrs = obs.get("optimizer", {}).get("group_lrs", {})
        la, lb = lrs.get("lora_A"), lrs.get("lora_B")
        if la is None or lb is None or abs(lb - a["lr_ratio"] * la) > 1e-12 * max(1.0, lb):
            p.append(f"LoRA+ needs lr_B = {a['lr_ratio']} x lr_A; optimizer has lr_A={la}, lr_B={lb}")
        return p


@register
class LoraFA(_LoraFamily):
    name = "lora_fa"
    summary = "LoRA-FA: A frozen at init, B trained with peft's LoRA-FA optimiser"
    freeze_A = True

    def make_optimizer(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft.optimizers import create_lorafa_optimizer

        return create_lorafa_optimizer(model, r=a["rank"], lora_alpha=a["alpha"], lr=ctx.lr,
                                       weight_decay=ctx.weight_decay)

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = super().expect(obs, a)
        if obs.get("optimizer", {}).get("class") != "LoraFAOptimizer":
            p.append(f"LoRA-FA needs peft's LoraFAOptimizer, got {obs.get('optimizer', {}).get('class')}")
        return p


# ----------------------------------------------------------------------------------------------
# Other peft tuners
# ----------------------------------------------------------------------------------------------


@register
class AdaLora(Method):
    name = "adalora"
    summary = "AdaLoRA: P diag(E) Q with budgeted rank init_r=ceil(1.5 r) -> r (peft AdaLoraConfig)"
    peft_type = "ADALORA"
    fields = ("rank", "alpha", "dropout", "target_modules")
    defaults = {"rank": 8, "alpha": _two_rank, "dropout": 0.0, "target_modules": "all-linear"}

    @staticmethod
    def schedule(total: int) -> dict:
        """AdaLoRA phases from the cell's step count: 10% warm-up, 20% final fine-tuning."""
        return {"total_step": total, "tinit": total // 10, "tfinal": total // 5, "deltaT": 1}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import AdaLoraConfig, get_peft_model

        cfg = AdaLoraConfig(
            target_r=a["rank"], init_r=math.ceil(1.5 * a["rank"]), lora_alpha=a["alpha"],
            lora_dropout=a["dropout"], target_modules=a["target_modules"], task_type="CAUSAL_LM",
            **self.schedule(ctx.total_steps),
        )
        return get_peft_model(model, cfg)

    def make_callbacks(self, model: Any, a: dict, ctx: Any) -> list:
        from lorarl.adapters.ops import AdaLoraCallback

        return [AdaLoraCallback()]

    def expect(self, obs: dict, a: dict) -> list[str]:
        return (_expect_peft(obs, "ADALORA") + _expect_trainable(obs)
                + _expect_kinds(obs, ("lora_A", "lora_B", "lora_E")))


@register
class Miss(Method):
    name = "miss"
    summary = "MiSS: one shard-shared matrix D expanded over W0 (peft MissConfig)"
    peft_type = "MISS"
    fields = ("rank", "dropout", "target_modules")
    defaults = {"rank": 64, "dropout": 0.0, "target_modules": "all-linear"}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import MissConfig, get_peft_model

        cfg = MissConfig(r=a["rank"], miss_dropout=a["dropout"], target_modules=a["target_modules"],
                         init_weights=True, task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    def expect(self, obs: dict, a: dict) -> list[str]:
        return _expect_peft(obs, "MISS") + _expect_trainable(obs) + _expect_kinds(obs, ("miss_block",))


@register
class Vera(Method):
    name = "vera"
    summary = "VeRA: frozen shared random A, B; trained scaling vectors b (init 0), d (init 0.1)"
    peft_type = "VERA"
    fields = ("rank", "dropout", "target_modules")
    defaults = {"rank": 256, "dropout": 0.0, "target_modules": "all-linear"}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import VeraConfig, get_peft_model

        cfg = VeraConfig(r=a["rank"], vera_dropout=a["dropout"], target_modules=a["target_modules"],
                         d_initial=0.1, projection_prng_key=ctx.seed, save_projection=True,
                         task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    def expect(self, obs: dict, a: dict) -> list[str]:
        return (_expect_peft(obs, "VERA") + _expect_trainable(obs)
                + _expect_kinds(obs, ("vera_lambda_b", "vera_lambda_d"), ("lora_A",)))


IA3_CANONICAL = ("k_proj", "v_proj", "down_proj")  # K, V and the FFN input (Liu et al. 2022; paper 002 Tab. 1)
FEEDFORWARD_NAMES = ("down_proj", "fc2", "wo", "dense_4h_to_h", "c_proj")


@register
class IA3(Method):
    name = "ia3"
    summary = "IA3: learned rescaling vectors of K, V and the FFN input (peft IA3Config)"
    peft_type = "IA3"
    fields = ("target_modules",)
    defaults = {"target_modules": "canonical"}

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import IA3Config, get_peft_model

        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = a["target_modules"]
        if targets == "canonical":
            targets = [t for t in IA3_CANONICAL if t in names]
            if not targets:
                targets = None  # peft's per-architecture default
        ff = None
        if isinstance(targets, list):
            ff = [t for t in targets if t in FEEDFORWARD_NAMES]
        cfg = IA3Config(target_modules=targets, feedforward_modules=ff, task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    def expect(self, obs: dict, a: dict) -> list[str]:
        return _expect_peft(obs, "IA3") + _expect_trainable(obs) + _expect_kinds(obs, ("ia3_l",))


@register
class LNTuning(Method):
    name = "ln_tuning"
    summary = "LayerNorm tuning: every norm layer's gain (and bias) trained (peft LNTuningConfig)"
    peft_type = "LN_TUNING"
    fields = ()

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from peft import LNTuningConfig, get_peft_model

        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if "norm" in type(m).__name__.lower() and n})
        if not names:
            raise ValueError("ln_tuning: the model has no normalisation layers")
        return get_peft_model(model, LNTuningConfig(target_modules=names, task_type="CAUSAL_LM"))

    def expect(self, obs: dict, a: dict) -> list[str]:
        return _expect_peft(obs, "LN_TUNING") + _expect_trainable(obs) + _expect_kinds(obs, ("ln_tuning_layers",))


# ----------------------------------------------------------------------------------------------
# Full fine-tuning, optionally sparse
# ----------------------------------------------------------------------------------------------


@register
class Full(Method):
    name = "full"
    summary = "full fine-tuning; with `mask`, only the masked-in entries of the target weights move"
    peft_type = None
    fields = ("mask", "mask_alpha", "mask_rank", "target_modules")
    defaults = {"mask": None, "mask_alpha": 0.5, "mask_rank": 16, "target_modules": "all-linear"}
    masks = MASKS

    def applicable(self, values: dict) -> tuple[str, ...]:
        return self.fields if values.get("mask") is not None else ("mask",)

    def build(self, model: Any, a: dict, ctx: Any) -> Any:
        from lorarl.adapters.ops import apply_masks

        for p in model.parameters():
            p.requires_grad_(True)
        if a.get("mask"):
            apply_masks(model, a, ctx)
        return model

    def make_optimizer(self, model: Any, a: dict, ctx: Any) -> Any:
        if not a.get("mask"):
            return None
        from lorarl.adapters.ops import MaskedAdamW

        return MaskedAdamW.for_model(model, ctx.masks, lr=ctx.lr, weight_decay=ctx.weight_decay)

    def expect(self, obs: dict, a: dict) -> list[str]:
        p = _expect_trainable(obs)
        if obs.get("peft_type") is not None:
            p.append(f"full fine-tuning got a peft model ({obs['peft_type']})")
        if a.get("mask"):
            m = obs.get("masks") or {}
            if not m.get("matrices"):
                p.append(f"mask {a['mask']!r} requested but no masked weights")
            if obs.get("optimizer", {}).get("class") != "MaskedAdamW":
                p.append("a masked cell needs MaskedAdamW (frozen entries must not decay)")
        elif obs.get("trainable_fraction") != 1.0:
            p.append(f"full fine-tuning trains {obs.get('trainable_fraction')} of the parameters, not all")
        return p
