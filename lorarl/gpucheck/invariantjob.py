"""The batch-invariant check's job: ``python -m lorarl.gpucheck.invariantjob STUDY RESULTS``.

A pack of K = 4 members of mixed LoRA ranks (:data:`RANKS`, alpha 2r; the pack study's first four cells, seeds
differing) against each member trained alone (a pack of one, the same code), ``runtime.batch_invariant`` off, then
on (the mode's GPU kernels are process-wide and cannot be turned off again: off runs first). Per mode and member:
whether its sampled token ids equal its run alone at every step, the first step where they do not, the largest
|difference| of its trained adapter; per mode the cost ledger's seconds per phase, packed and alone, and packed vs
alone as a distribution over the members' seeds: each seed's mean ``loss`` over the steps, packed minus alone, and
the equivalence test's interval of their mean (TOST at alpha 0.05, the adaptive hypotheses' fixed-n interval:
lorarl.adaptive.sequential), for where the runs are not equal. Then a probe of
the base model's forward, to name the operation that depends on the batch: one member's rows alone and among 3 x as
many others' rows, each module's output on those rows compared; the first module (in execution order) whose output
differs, and by how much. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import Any

RANKS = (1, 8, 32, 64)  # mixed ranks of the pack (alpha 2r): the smallest, a middle pair, a large one


def member_cells(study: str, on: bool) -> list[Any]:
    from lorarl.language.config import CellConfig
    from lorarl.language.study import load_study, study_cells

    out = []
    for c, r in zip(study_cells(load_study(study))[: len(RANKS)], RANKS):
        d = c.config.model_dump()
        d["adapter"] = {**d["adapter"], "rank": r, "alpha": 2 * r}
        d["runtime"] = {**d["runtime"], "batch_invariant": on}
        out.append(SimpleNamespace(id=f"{c.id}-r{r}", config=CellConfig(**d)))
    return out


def train(cells: list[Any], results: str, device: str) -> dict[str, Any]:
    """``cells`` as one pack for their steps: each member's token ids per step, adapter, and the phases' seconds."""
    from lorarl import ledger
    from lorarl.pack.build import build_pack

    pack = build_pack(cells, results_dir=results, device=device)
    ledger.begin(in_process=True)
    ids: dict[str, list] = {c.id: [] for c in cells}
    loss: dict[str, list] = {c.id: [] for c in cells}
    t0 = time.perf_counter()
    for _ in range(max(c.config.train.steps for c in cells)):
        for name, row in pack.loop.step().items():
            loss[name].append(row["loss"])
        for name, rows in pack.loop.last_rollouts.items():
            ids[name].append(rows)
    phases = {p: ledger.total(p) for p in ("generation", "reward", "reference", "update", "handoff")}
    phases["step"] = time.perf_counter() - t0
    weights = {c.name: {n: p.detach().float().cpu() for n, p in c.model.named_parameters() if p.requires_grad}
               for c in pack.loop.trainer.cells}
    return {"ids": ids, "weights": weights, "phases": phases, "loss": {n: sum(v) / len(v) for n, v in loss.items()}}


def compare(cells: list[Any], results: str, device: str) -> dict[str, Any]:
    from lorarl.adaptive.sequential import critical_value, interval

    packed = train(cells, f"{results}/packed", device)
    alone = {"phases": {}, "members": {}}
    d = []
    for c in cells:
        one = train([c], f"{results}/alone", device)
        for p, s in one["phases"].items():
            alone["phases"][p] = alone["phases"].get(p, 0.0) + s
        steps = [a == b for a, b in zip(packed["ids"][c.id], one["ids"][c.id])]
        w, v = packed["weights"][c.id], one["weights"][c.id]
        alone["members"][c.id] = {"rank": c.config.adapter.rank, "tokens_equal": all(steps),
                                  "first_differing_step": next((i + 1 for i, s in enumerate(steps) if not s), None),
                                  "adapter_diff": max(float((w[n] - v[n]).abs().max()) for n in w)}
        d.append(packed["loss"][c.id] - one["loss"][c.id])
    mean, lo, hi = interval(d, critical_value(len(d), len(d), len(d), 0.05, 1.0))
    seeds = {"metric": "loss", "d": d, "mean": mean, "lower": lo if lo > -1e308 else None,
             "upper": hi if hi < 1e308 else None}  # unbounded (no spread, e.g. all equal): null
    return {"members": alone["members"], "packed_s": packed["phases"], "alone_s": alone["phases"], "seeds": seeds}


def probe(model_dir: str, device: str, rows: int = 4, others: int = 12, length: int = 64) -> dict[str, Any]:
    """The first module whose output on one member's ``rows`` differs between a batch of them alone and a batch with
    ``others`` rows after them (the base model in bf16, as the pack check's twin; random token ids)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows + others, length), generator=g).to(device)
    seen: dict[str, list] = {}
    order: list[str] = []

    def hook(name):
        def keep(mod, inp, out):
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.size(0) >= rows:
                seen.setdefault(name, []).append(t[:rows].detach().float().cpu())
                if name not in order:
                    order.append(name)
        return keep

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    with torch.no_grad():
        model(input_ids=ids[:rows])
        model(input_ids=ids)
    for h in handles:
        h.remove()
    for name in order:
        a, b = seen[name][:2] if len(seen[name]) >= 2 else (None, None)
        if a is not None and a.shape == b.shape and not torch.equal(a, b):
            return {"first_module": name, "module": type(model.get_submodule(name)).__name__,
                    "max_diff": float((a - b).abs().max()), "rows": rows, "batch": rows + others}
    return {"first_module": None, "rows": rows, "batch": rows + others}


def main() -> None:
    study, results = sys.argv[1:3]
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = member_cells(study, False)[0].config.model
    out = {"ranks": list(RANKS), "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
    out["off"] = compare(member_cells(study, False), f"{results}/off", device)
    out["probe_off"] = probe(model_dir, device)
    out["on"] = compare(member_cells(study, True), f"{results}/on", device)  # the mode's kernels from here on
    out["probe_on"] = probe(model_dir, device)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
