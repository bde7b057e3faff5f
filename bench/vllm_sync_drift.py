"""How far TRL's weight push (merge_adapter → read → unmerge_adapter) moves the frozen base, vs lorarl's exact push.

TRL 1.16 pushes a PEFT policy to vLLM by merging the adapter into the base weights in place, reading them,
and unmerging. In bf16 ``(W + s*BA) - s*BA != W``: every push leaves rounding error in the frozen base, and
the trained policy drifts away from "base + adapter" over a run. lorarl.train.rollout.effective_named_params
merges one layer at a time and restores the base from a saved copy (bit for bit). This script runs both
pushes ``--syncs`` times on a Qwen2-shaped model (random weights, LoRA with trained-like adapters) and
prints the base drift of each, side by side. Only torch, transformers and peft are needed.

    python bench/vllm_sync_drift.py --device cuda --hidden 1536 --layers 2 --syncs 200
"""

from __future__ import annotations

import argparse
import time

import torch


def build(hidden: int, layers: int, rank: int, device: str, seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=max(hidden // 128, 1), num_key_value_heads=max(hidden // 768, 1),
                      vocab_size=1024, max_position_embeddings=512)
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)
    pm = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                          task_type="CAUSAL_LM"))
    with torch.no_grad():  # an adapter after some training: B no longer zero
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1e-3)
    return pm


def base_state(pm) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in pm.named_parameters() if "base_layer" in n}


def drift(pm, ref: dict[str, torch.Tensor]) -> tuple[float, float]:
    changed = total = 0
    worst = 0.0
    for n, p in pm.named_parameters():
        if n in ref:
            d = (p.detach().float() - ref[n].float()).abs()
            changed += int((d > 0).sum())
            total += d.numel()
            worst = max(worst, float(d.max()))
    return changed / total, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--syncs", type=int, default=50)
    a = ap.parse_args()
    from lorarl.train.rollout import effective_named_params

    print(f"device {a.device} ({torch.cuda.get_device_name(0) if a.device == 'cuda' else 'cpu'}), bf16, "
          f"hidden {a.hidden}, layers {a.layers}, LoRA r={a.rank}, {a.syncs} pushes each")
    for name in ("trl merge/unmerge", "lorarl exact"):
        pm = build(a.hidden, a.layers, a.rank, a.device)
        ref = base_state(pm)
        t0 = time.perf_counter()
        for _ in range(a.syncs):
            if name == "trl merge/unmerge":
                pm.merge_adapter()
                pushed = [(n, p.data) for n, p in pm.named_parameters() if "lora_" not in n]  # what TRL reads
                pm.unmerge_adapter()
            else:
                pushed = list(effective_named_params(pm))
        if a.device == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.syncs
        frac, worst = drift(pm, ref)
        print(f"{name:18s}: base elements changed {frac:.2%}, max |dW| {worst:.3g}, {wall * 1000:.1f} ms/push "
              f"({len(pushed)} tensors)")


if __name__ == "__main__":
    main()
