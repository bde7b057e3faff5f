"""What handing a pack member's new LoRA adapter to vLLM costs per training step, at a real size: through disk
against from memory, side by side.

vLLM 0.26 / 0.31 take a LoRA adapter as a folder (``LoRARequest.lora_path``; vllm/lora/worker_manager.py
``_load_adapter`` -> ``LoRAModel.from_local_checkpoint`` reads ``adapter_model.safetensors`` with
``safetensors.safe_open``). lorarl.pack.lora_memory hands the tensors to the worker instead
(``LoRAModel.from_lora_tensors``, the function the folder reader ends in). Per member per step:

* disk: the save (PEFT's file layout, flushed to disk), then the read as vLLM reads it (from the page cache: the
  pack reads what it has just written);
* memory: the adapter's tensors copied (lorarl.adapters.build.adapter_state: training goes on in place) into
  one of two sets kept per member (written in turn: the engine holds the other; new memory each step would cost
  its first touch, several times the copy), then the same ``LoRAModel`` built from them;
* both then copy every tensor once more (vLLM's activation into its stacked LoRA slots, emulated by a copy into a
  fresh tensor: it also makes the disk path read every byte of its memory map).

With vLLM importable (``.venv-vllm``) the reads are vLLM's own functions (``from_local_checkpoint`` /
``from_lora_tensors``); without it, safetensors' read and a dict of the copies. The design before these
re-registered the same id with ``load_inplace=True``, which vLLM re-reads at every engine step (every decoded token).

The state: a LoRA of Qwen2.5-1.5B's shapes (28 layers, hidden 1536, intermediate 8960, 2 KV heads of 128; every
linear layer adapted; fp32, as lorarl's bf16-mixed training keeps trainable tensors). Only torch, safetensors and
(optionally) vLLM. The GPU step time it competes with is not measured here.

    .venv-vllm/bin/python bench/lora_handoff.py --rank 64 --repeats 5 --tokens 1024 --members 4 --threads 1
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


MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def readers(rank: int):
    """(disk read, memory read, name): vLLM's LoRAModel builders where vLLM is importable, else the plain ones."""
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": "all-linear"}
    try:
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper
    except ImportError:
        return load, lambda state: dict(state), "safetensors (no vLLM here)"

    def disk(folder: Path):
        helper = PEFTHelper.from_local_dir(str(folder), None)
        return LoRAModel.from_local_checkpoint(str(folder), MODULES, peft_helper=helper, lora_model_id=1, device="cpu",
                                               dtype=torch.float32)

    def memory(state: dict[str, torch.Tensor]):
        helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": None})
        return LoRAModel.from_lora_tensors(1, state, helper, device="cpu", dtype=torch.float32)

    import vllm

    return disk, memory, f"vLLM {vllm.__version__} LoRAModel"


def copy_into(state: dict[str, torch.Tensor], kept: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """lorarl.adapters.build.adapter_state(out=kept): the adapter's tensors copied into a set kept from two steps
    ago (the engine holds the other), allocated on first use."""
    for k, v in state.items():
        if k in kept:
            kept[k].copy_(v.detach())
        else:
            kept[k] = v.detach().clone()
    return kept


def slot_copy(lora) -> int:
    """vLLM's activation: every tensor copied once (into its LoRA slots); the tensors count."""
    tensors = ([t for w in lora.loras.values() for t in (w.lora_a, w.lora_b)] if hasattr(lora, "loras")
               else list(lora.values()))
    for t in tensors:
        torch.empty_like(t).copy_(t)
    return len(tensors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=1024, help="decoded tokens per step (engine steps of in-place reloads)")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where adapters are written (default: a temporary folder)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a pack's engine on the CPU computes on one)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)  # more than the idle cores: OpenMP's spinning threads wait on each other
    state = lora_state(a.rank, **QWEN25_15B)
    mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    disk_read, memory_read, via = readers(a.rank)
    print(f"LoRA r={a.rank} on Qwen2.5-1.5B shapes: {sum(t.numel() for t in state.values()) / 1e6:.1f}M params, "
          f"{mb:.0f} MiB (fp32), {len(state)} tensors; torch threads {torch.get_num_threads()}; reads: {via}")
    names = ("save", "load", "disk_slots", "copy", "build", "memory_slots")
    times: dict[str, list[float]] = {k: [] for k in names}  # wall seconds
    cpu: dict[str, list[float]] = {k: [] for k in names}  # CPU seconds of this process (what other load inflates less)
    sets: list[dict[str, torch.Tensor]] = [{}, {}]  # lorarl's two tensor sets per member, written in turn
    for kept in sets:  # the pack's first two steps allocate them; every later step copies into one
        copy_into(state, kept)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for i in range(a.repeats):  # disk, memory, disk, memory, ...
            folder = Path(tmp) / f"step-{i}"
            held: dict[str, object] = {}
            steps = (("save", lambda: save(state, folder, a.rank)), ("load", lambda: held.update(disk=disk_read(folder))),
                     ("disk_slots", lambda: held.update(n_disk=slot_copy(held["disk"]))),
                     ("copy", lambda: held.update(copied=copy_into(state, sets[i % 2]))),
                     ("build", lambda: held.update(built=memory_read(held["copied"]))),
                     ("memory_slots", lambda: held.update(n_memory=slot_copy(held["built"]))))
            for name, fn in steps:
                w0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
            assert held["n_disk"] == held["n_memory"] == len(state), (held["n_disk"], held["n_memory"])
    med = {k: statistics.median(v) for k, v in times.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    disk = med["save"] + med["load"] + med["disk_slots"]
    memory = med["copy"] + med["build"] + med["memory_slots"]
    disk_cpu = mcpu["save"] + mcpu["load"] + mcpu["disk_slots"]
    memory_cpu = mcpu["copy"] + mcpu["build"] + mcpu["memory_slots"]
    print(f"per member per step (median of {a.repeats}), wall seconds [CPU seconds]; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs:")
    print(f"  disk:   save {med['save']:.3f} + read {med['load']:.3f} + slot copy {med['disk_slots']:.3f} = {disk:.3f} "
          f"[{disk_cpu:.3f}]")
    print(f"  memory: copy {med['copy']:.3f} + build {med['build']:.3f} + slot copy {med['memory_slots']:.3f} = "
          f"{memory:.3f} [{memory_cpu:.3f}]")
    print(f"disk / memory = {disk / memory:.1f}x wall, {disk_cpu / memory_cpu:.1f}x CPU; the hand-off alone (copy + "
          f"build, the slot copy being vLLM's on both paths): {med['copy'] + med['build']:.3f} s "
          f"[{mcpu['copy'] + mcpu['build']:.3f}] against the 0.05 s target")
    print(f"pack of {a.members}: {a.members * disk:.2f} s per training step through disk, {a.members * memory:.2f} s "
          f"from memory (EngineAdapters: one hand-off per member per step)")
    print(f"the in-place design (load_inplace=True, re-read every engine step): {a.members} x {a.tokens} reads x "
          f"{med['load']:.3f} s = {a.members * a.tokens * med['load']:.0f} s per training step")


if __name__ == "__main__":
    main()
