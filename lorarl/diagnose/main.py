"""Diagnose stage: weight-space diagnostics of one trained cell → diagnostics.parquet + MLflow.

W0 is always the ORIGINAL base weight (loaded fresh from the base model, never peft's possibly
rewritten residual), W+ the effective weight after training (adapter merged, or the fully
fine-tuned weight). For residual inits (PiSSA, MiLoRA, OLoRA, ...) W+ − W0 = (α/r)(BA − B0A0), so the
adapter product (α/r)BA, the matrix paper 003 Fig. 3 decomposes, is diagnosed too (``product_update_*``
rows beside the ``update_*`` rows of W+ − W0). The LoRA A of each eval_every snapshot the cell saved and of the
final adapter gives paper 003 Fig. 7's subspace similarity through training (``subspace_sim_*_step`` rows,
index = training step; W0's SVD shared). The math lives in lorarl.diagnose.weights (pure functions).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lorarl import paths
from lorarl.jobclock import first_work
from lorarl.language.study import Cell

LORA_A = re.compile(r"base_model\.model\.(.+)\.lora_A(?:\.default)?\.weight")  # a saved adapter's A

SUMMARY_METRICS = ("spectral_drift", "rel_update_fro", "max_angle_left_deg", "max_angle_right_deg",
                   "bf16_sparsity", "subspace_sim_top", "subspace_sim_bottom", "overlap_principal",
                   "overlap_low_magnitude")


def weight_pairs(base_path: str, adapter_dir: Path, full: bool) -> tuple[dict[str, tuple], str]:
    """({module name: (W0, W+, A or None, (α/r)BA as a LowRank or None, W+ − W0 as a LowRank or None)}, the
    base's content key) for every adapted (or, for full FT, every) Linear. A residual init's adapter is saved
    converted for the original base (lorarl.adapters.build: A' = [A; A0], B' = [B, −B0], rank 2r, same scale):
    A and the product (α/r)BA are its first r directions; other adapters get no product (it is W+ − W0 there).
    W+ − W0 is given as s·B'A' only where the merged weight equals it (`_low_rank_update`); DoRA's magnitude,
    masks or any other merge keep the dense path."""
    import torch
    from transformers import AutoModelForCausalLM

    from lorarl.adapters.svd_cache import model_key, param_digests
    from lorarl.diagnose.weights import LowRank

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    key = model_key(digests=param_digests(base))
    w0 = {n: m.weight.detach().clone() for n, m in base.named_modules()
          if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    if full:
        tuned = AutoModelForCausalLM.from_pretrained(str(adapter_dir), dtype=torch.float32)
        mods = dict(tuned.named_modules())
        return {n: (w0[n], mods[n].weight.detach(), None, None, None) for n in w0}, key
    from peft import PeftModel

    meta = adapter_dir / "lorarl_adapter.json"
    converted = meta.exists() and bool(json.loads(meta.read_text()).get("residual_converted"))
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir))
    prefix = "base_model.model."
    a_mats, p_mats, u_mats = {}, {}, {}
    for n, m in peft_model.named_modules():
        lora_a = getattr(m, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict) and "default" in lora_a:
            name = n[len(prefix):] if n.startswith(prefix) else n
            a = lora_a["default"].weight.detach().clone()
            b = m.lora_B["default"].weight.detach().clone()
            s = float(m.scaling["default"])
            u_mats[name] = LowRank(b, a, s)
            if converted:  # the trained factors: the first r of the 2r directions; s·BA with peft's scaling
                r = a.shape[0] // 2
                a = a[:r].contiguous()
                p_mats[name] = LowRank(b[:, :r].contiguous(), a, s)
            a_mats[name] = a
    merged = peft_model.merge_and_unload()
    mods = dict(merged.named_modules())
    names = sorted(a_mats) if a_mats else [n for n in w0 if n in mods]
    out = {}
    for n in names:
        w1 = mods[n].weight.detach()
        upd = u_mats.get(n)
        out[n] = (w0[n], w1, a_mats.get(n), p_mats.get(n), upd if upd and _low_rank_update(w0[n], w1, upd) else None)
    return out, key


def _low_rank_update(w0, w1, upd) -> bool:
    """Whether the merged W+ is W0 + s·B·A up to float32 merge rounding (plain LoRA, residual inits' converted
    adapters), not a DoRA magnitude, a mask or another merge: |W+ − W0 − s·BA| ≤ 1e-5·max|W0| everywhere
    (a merge's rounding is ~6e-8·|W+|; a method that merges otherwise misses by far more)."""
    import torch

    gap = (w1.double() - w0.double() - upd.dense().to(w1.device)).abs().max()
    return bool(gap <= 1e-5 * max(float(w0.abs().max()), float(torch.finfo(torch.float32).tiny)))


def lora_factors(adapter_dir: Path) -> dict:
    """{module name: trained LoRA A} of a saved adapter (a snapshot or the final one), read from its safetensors
    without building a model; a residual init's converted adapter holds [A; A0]: A is its first half.
    Empty for adapters without a LoRA A (full fine-tuning, IA3, VeRA's shared ones...)."""
    from safetensors.torch import load_file

    f = adapter_dir / "adapter_model.safetensors"
    if not f.exists():
        return {}
    meta = adapter_dir / "lorarl_adapter.json"
    converted = meta.exists() and bool(json.loads(meta.read_text()).get("residual_converted"))
    out = {}
    for key, t in load_file(str(f)).items():
        m = LORA_A.fullmatch(key)
        if m:
            out[m.group(1)] = t[: t.shape[0] // 2] if converted else t
    return out


def factors_through_training(study: str, cell: Cell, results_dir: str | Path, pairs: dict) -> dict:
    """Module name -> {training step: A}: the eval_every snapshots the cell saved, and the final A at the last
    step (paper 003 Fig. 7 through training); empty for cells without a LoRA A."""
    from lorarl.language.evalplan.plan import snapshot_steps

    out: dict[str, dict[int, object]] = {}
    for step in snapshot_steps(cell.config):
        snap = paths.path("snapshot", results=results_dir, study=study, cell=cell.id, step=step)
        for name, a in lora_factors(snap).items():
            out.setdefault(name, {})[step] = a
    for name, (_, _, a, *_) in pairs.items():
        if a is not None:
            out.setdefault(name, {})[cell.config.train.steps] = a
    return out


def diagnose_cell(study: str, cell: Cell, results_dir: str | Path = "results", threads: int | None = None) -> dict:
    import torch

    from lorarl.diagnose.cache import BaseCache
    from lorarl.diagnose.weights import diagnose_model, write_parquet
    from lorarl.models import resolve_model
    from lorarl.tracking.client import Tracker

    if threads:
        torch.set_num_threads(threads)
    cfg = cell.config
    kw = dict(results=results_dir, study=study, cell=cell.id)
    pairs, base_key = weight_pairs(resolve_model(cfg.model, results_dir), paths.path("adapter", **kw),
                                   full=cfg.adapter.method == "full")
    first_work("diagnostic")  # weights loaded: the job's start-up ends here (lorarl.jobclock)
    k = min(16, min(min(w[0].shape) for w in pairs.values()))
    cache = BaseCache(Path(results_dir) / "svd_cache", base_key)  # W0's SVDs: once per base, every cell
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the job's device (not testable here: GPU)
    df = diagnose_model(pairs, factors_through_training(study, cell, results_dir, pairs), cache=cache, k=k,
                        device=device)
    out = paths.path("diagnostics", **kw)
    write_parquet(df, out)
    scalars = df[df["metric"].isin(SUMMARY_METRICS)].groupby("metric")["value"].mean()
    summary = {f"diag/{m}": float(v) for m, v in scalars.items()}
    run_id = json.loads(paths.path("summary", **kw).read_text())["mlflow_run_id"]
    tracker = Tracker(results_dir, study)
    tracker.run_id = run_id
    tracker.log_summary(summary)
    return {"matrices": len(pairs), **summary}
