"""W0's `BaseFactors` per (base model, module), computed once and shared by every cell that diagnoses it.

Layout: `<root>/<model-key>/diagnose/<module name>.pt`, root = `results/svd_cache` (the SVD-init cache's, whose
key, digest check, lock and atomic write this reuses: lorarl.adapters.svd_cache). The model key is the base's
content digest; each file also stores its own weight's digest and is recomputed if that does not match. A file
keeps K = the next power of two ≥ max(64, what was asked) singular vectors per side and end, all singular values
and one full M×M-side factor, all float64 (Qwen3-1.7B all-linear: 5.9 GiB per base; docs/report.md). Concurrent
jobs: the first computes under the folder's lock, the others wait and read its file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lorarl.adapters.svd_cache import atomic_save, file_lock, keep_for, load_entry, tensor_digest, timed_miss
from lorarl.diagnose.weights import BaseFactors, base_factors


class BaseCache:
    """get(name, W0, need) -> W0's BaseFactors with at least `need` vectors per side and end, on W0's device.

    root=None keeps them in memory only; stats count hits / misses and the seconds spent in W0's SVDs."""

    def __init__(self, root: str | Path | None, key: str):
        self.dir = Path(root) / key / "diagnose" if root is not None else None
        self._mem: dict[str, tuple[str, BaseFactors]] = {}
        self.stats = {"hits": 0, "misses": 0, "svd_seconds": 0.0}

    def get(self, name: str, W0: torch.Tensor, need: int, digest: str | None = None) -> BaseFactors:
        digest = digest or tensor_digest(W0)
        if name in self._mem and self._mem[name][0] == digest and _enough(self._mem[name][1], need):
            self.stats["hits"] += 1
            return self._mem[name][1].to(W0.device)
        if self.dir is None:
            base = self._compute(W0, need)
        else:
            with file_lock(self.dir / ".lock"):
                base = self._load(self.dir / f"{name}.pt", digest, need)
                if base is None:
                    base = self._compute(W0, need)
                    atomic_save({"digest": digest, **{k: v.cpu() if torch.is_tensor(v) else v
                                                      for k, v in base.as_dict().items()}},
                                self.dir / f"{name}.pt")
                else:
                    self.stats["hits"] += 1
        self._mem[name] = (digest, base)
        return base.to(W0.device)

    @staticmethod
    def _load(path: Path, digest: str, need: int) -> BaseFactors | None:
        d = load_entry(path, digest)
        if d is None:
            return None
        d.pop("digest")
        try:
            base = BaseFactors(**d)
        except TypeError:  # another layout: recomputed
            return None
        return base if _enough(base, need) else None

    def _compute(self, W0: torch.Tensor, need: int) -> BaseFactors:
        return timed_miss(self.stats, W0, lambda: base_factors(W0, keep_for(need)))


def _enough(base: BaseFactors, need: int) -> bool:
    return base.K >= min(need, base.S_M.numel())
