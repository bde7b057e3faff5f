"""What the PEFT method modules share: LoRA-family fields/defaults, the `LoraFamily` base (lora, dora,
rslora, lora_plus, lora_fa), observation checks (`expect_*`) and the step-0 init check."""

from __future__ import annotations

import math
from typing import Any

from lorarl.adapters.names import INITS, RESIDUAL_INITS
from lorarl.adapters.registry import Method

ADAM_BETAS = (0.9, 0.999)  # transformers.TrainingArguments defaults (what the stock trainer uses)
ADAM_EPS = 1e-8


def two_rank(v: dict) -> float:
    """2 x rank"""
    return 2.0 * v["rank"]


LORA_FIELDS = ("rank", "alpha", "dropout", "target_modules", "init")
LORA_DEFAULTS = {"rank": 8, "alpha": two_rank, "dropout": 0.0, "target_modules": "all-linear", "init": "kaiming"}


def expect_kinds(obs: dict, present: tuple[str, ...], absent: tuple[str, ...] = ()) -> list[str]:
    out = []
    kinds = obs.get("kinds", {})
    for k in present:
        if not kinds.get(k, {}).get("tensors"):
            out.append(f"no `{k}` tensors in the model")
    for k in absent:
        if kinds.get(k, {}).get("tensors"):
            out.append(f"unexpected `{k}` tensors in the model")
    return out


def expect_peft(obs: dict, peft_type: str) -> list[str]:
    if obs.get("peft_type") != peft_type:
        return [f"peft type is {obs.get('peft_type')!r}, expected {peft_type!r}"]
    return []


def expect_trainable(obs: dict) -> list[str]:
    return [] if obs.get("params_trainable", 0) > 0 else ["nothing is trainable"]


class LoraFamily(Method):
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
        p = expect_peft(obs, "LORA") + expect_trainable(obs)
        p += expect_kinds(obs, ("lora_A", "lora_B"))
        p += expect_kinds(obs, ("lora_magnitude_vector",)) if self.use_dora else \
            expect_kinds(obs, (), ("lora_magnitude_vector",))
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
