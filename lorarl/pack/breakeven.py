"""Pack or solo for ``rollout.engine: vllm`` cells: the measured break-even table decides.

vLLM's LoRA decode costs more as adapters and ranks grow (vLLM #14435), so a pack of K members in one multi-LoRA
engine can sample fewer tokens per second than K merged solo engines. bench/vllm_pack_breakeven.py measures
pack tokens/s / solo tokens/s for K in {1, 2, 4, 8} x max rank in {1, 8, 64, 256} on one device and writes the
table (``ratio[rank][K]``, wall; ``ratio_cpu``, per CPU-second; ``decide`` names the one the packer reads; with
the machine and command) to bench/results/vllm_pack_breakeven-<device>.json.

:func:`verdict` reads it conservatively: the smallest measured rank at or above the pack's largest SAVED rank (a
residual init is handed to vLLM at 2r), the largest measured K at or below the pack's size (bigger batches only
help the pack); a ratio below 1 declines the pack. lorarl.pack.plan.plan_packs asks it for every vLLM pack it forms
and splits a declined one into solo runs, with a log line saying why; the hosting plan (lorarl.pack.hosting) asks it
for every resident vLLM job (``pack.places``) at the adapters its engine holds at once, ``min(places, members)``
(lorarl.pack.plan.split_losing); a device without a measured table keeps its packs (also said).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
TABLES = {"cpu": RESULTS / "vllm_pack_breakeven-cpu.json"}  # device -> the measured table (a GPU's when measured)
_SAID: set[str] = set()  # log lines already printed by this process (the plan is made more than once per parse)


@dataclass(frozen=True)
class Verdict:
    """Whether a vLLM pack samples faster than its members' solo runs, and why."""

    pack: bool  # False: the members train solo
    why: str  # the log line's reason: the table's cell, its ratio, the machine it was measured on


def load_table(path: str | Path) -> dict[str, Any]:
    """A table written by bench/vllm_pack_breakeven.py; a clear error when it is not one."""
    table = json.loads(Path(path).read_text())
    ratio = table.get(table.get("decide", "ratio")) if isinstance(table, dict) else None
    if not isinstance(ratio, dict) or not ratio or not all(isinstance(v, dict) and v for v in ratio.values()):
        raise ValueError(f"{path}: not a break-even table (no 'ratio' of rank -> K -> pack/solo tokens/s, or no "
                         "table under the name 'decide' gives); write one with bench/vllm_pack_breakeven.py --table")
    return table


def verdict(table: dict[str, Any], members: int, max_rank: int) -> Verdict:
    """Pack ``members`` cells whose largest saved rank is ``max_rank`` in one vLLM engine, or run them solo?"""
    ratio = table[table.get("decide", "ratio")]
    ranks = sorted(int(r) for r in ratio)
    rank = next((r for r in ranks if r >= max_rank), ranks[-1])
    row = ratio[str(rank)]
    ks = sorted(int(k) for k in row)
    k = max([x for x in ks if x <= members] or ks[:1])
    q = float(row[str(k)])
    beyond = f" (rank {max_rank} is above the table's largest)" if max_rank > ranks[-1] else ""
    per = "tokens/CPU-s" if table.get("decide") == "ratio_cpu" else "tokens/s"
    where = (f"measured pack/solo {per} {q:.2f} at K={k}, max rank {rank}{beyond} "
             f"({table.get('device', '?')}: {table.get('machine', 'machine not recorded')})")
    if q < 1.0:
        return Verdict(False, f"{where}: below 1, the pack samples slower than its members' solo engines")
    return Verdict(True, where)


def host_device() -> str:
    """Where this host's pack jobs sample: ``gpu`` where the NVIDIA driver's tool is on the path, else ``cpu``."""
    import shutil

    return "gpu" if shutil.which("nvidia-smi") else "cpu"


def host_table() -> dict[str, Any] | None:
    """The measured table of the device this host's pack jobs run on (:func:`host_device`), or None."""
    device = host_device()
    path = TABLES.get(device)
    if path is None or not path.exists():
        say(f"[lorarl] pack: no measured vLLM break-even table for {device} (bench/vllm_pack_breakeven.py): "
            "vLLM packs kept as planned")
        return None
    return load_table(path)


def say(line: str) -> None:
    """Print a plan's log line once per process (to stderr: Snakemake's parse output)."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)
