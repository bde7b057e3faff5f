"""What handing a pack member's new LoRA adapter to vLLM through disk costs per training step, at a real size.

vLLM 0.26 / 0.31 take a LoRA adapter only as a folder (``LoRARequest.lora_path``; vllm/lora/worker_manager.py
``_load_adapter`` -> ``LoRAModel.from_local_checkpoint`` reads ``adapter_model.safetensors`` with
``safetensors.safe_open``); there is no supported in-memory path. So each training step of a multi-LoRA pack
saves every member's adapter and the engine reads it back: lorarl.pack.multilora.EngineAdapters does this once per
member per step (a fresh id per step). The design it replaces re-registered the same id with
``load_inplace=True``, which vLLM re-reads at every engine step, i.e. once per decoded token.

This script builds a LoRA state dict of Qwen2.5-1.5B's shapes (28 layers, hidden 1536, intermediate 8960, 2 KV heads
of 128; every linear layer adapted; fp32, as lorarl's bf16-mixed training keeps trainable tensors) and times,
side by side in one run: the save (PEFT's file layout, flushed to disk), the load as vLLM reads it (from the page
cache: the pack reads what it has just written), and an in-memory copy of the same tensors (what a tensor path
would cost on the CPU). Only torch and safetensors. The GPU step time it competes with is not measured here.

    python bench/lora_handoff.py --rank 64 --repeats 3 --tokens 1024 --members 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

QWEN25_15B = dict(layers=28, hidden=1536, intermediate=8960, kv=2 * 128)  # config.json of Qwen2.5-1.5B


def lora_state(rank: int, layers: int, hidden: int, intermediate: int, kv: int) -> dict[str, torch.Tensor]:
    """PEFT key names and shapes of a LoRA on every linear layer (lora_A: [r, in], lora_B: [out, r])."""
    mods = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, kv), "self_attn.v_proj": (hidden, kv),
            "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (hidden, intermediate),
            "mlp.up_proj": (hidden, intermediate), "mlp.down_proj": (intermediate, hidden)}
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(layers):
        for m, (fan_in, fan_out) in mods.items():
            key = f"base_model.model.model.layers.{i}.{m}"
            out[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * 0.01
            out[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    return out


def save(state: dict[str, torch.Tensor], folder: Path, rank: int) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                            "target_modules": "all-linear"}))
    with open(folder / "adapter_model.safetensors", "rb+") as fh:
        os.fsync(fh.fileno())  # on disk, not only in the page cache


def load(folder: Path) -> dict[str, torch.Tensor]:
    """As vLLM's LoRAModel.from_local_checkpoint reads the folder (safe_open, every tensor to CPU); each tensor is
    copied out of the memory map (``get_tensor`` is lazy; vLLM's copy to the GPU reads every byte)."""
    import safetensors

    json.loads((folder / "adapter_config.json").read_text())
    with safetensors.safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k).clone() for k in f.keys()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1024, help="decoded tokens per step (engine steps of in-place reloads)")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where adapters are written (default: a temporary folder)")
    a = ap.parse_args()
    state = lora_state(a.rank, **QWEN25_15B)
    mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    print(f"LoRA r={a.rank} on Qwen2.5-1.5B shapes: {sum(t.numel() for t in state.values()) / 1e6:.1f}M params, "
          f"{mb:.0f} MiB (fp32), {len(state)} tensors; torch threads {torch.get_num_threads()}")
    times: dict[str, list[float]] = {"save": [], "load": [], "copy": []}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for i in range(a.repeats):
            folder = Path(tmp) / f"step-{i}"
            t0 = time.perf_counter()
            save(state, folder, a.rank)
            t1 = time.perf_counter()
            back = load(folder)
            t2 = time.perf_counter()
            copied = {k: v.clone() for k, v in state.items()}
            t3 = time.perf_counter()
            assert all(torch.equal(back[k], state[k]) for k in state) and len(copied) == len(state)
            times["save"].append(t1 - t0)
            times["load"].append(t2 - t1)
            times["copy"].append(t3 - t2)
    med = {k: statistics.median(v) for k, v in times.items()}
    disk = med["save"] + med["load"]
    print(f"per member per step (median of {a.repeats}): save {med['save']:.3f} s + load {med['load']:.3f} s = "
          f"{disk:.3f} s; in-memory copy {med['copy']:.3f} s; disk / in-memory = {disk / med['copy']:.1f}x")
    print(f"pack of {a.members}: {a.members * disk:.2f} s per training step through disk (EngineAdapters: one read "
          f"per member per step)")
    print(f"the in-place design (load_inplace=True, re-read every engine step): {a.members} x {a.tokens} reads x "
          f"{med['load']:.3f} s = {a.members * a.tokens * med['load']:.0f} s per training step")


if __name__ == "__main__":
    main()
