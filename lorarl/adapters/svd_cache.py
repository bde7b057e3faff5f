"""SVD of each target weight, computed once per (base model, module) and cached on disk.

Layout: `<root>/<model-key>/<module name>.pt`, root = `results/svd_cache` in cells. The model key is
a BLAKE2b digest of every parameter's name, dtype, shape and bytes (so a rebuilt local model gets a
new key, and a cell never reads the spectrum of another model); each file also stores the digest of
its own weight and is recomputed if that does not match. A file keeps all singular values and the
top/bottom K singular vectors, K = the next power of two ≥ max(64, what was asked): every cell of a
rank sweep up to K shares one file; a larger request recomputes and replaces it (atomic rename).
Computation runs in float32 on the weight's device (the GPU in a cluster cell).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from lorarl.adapters.inits import Spectrum, spectrum_of

MIN_KEEP = 64


def tensor_digest(t: torch.Tensor, h=None) -> str:
    """BLAKE2b of a tensor's dtype, shape and raw bytes (device independent)."""
    own = h is None
    h = h or hashlib.blake2b(digest_size=16)
    t = t.detach()
    h.update(f"{t.dtype}:{tuple(t.shape)}:".encode())
    flat = t.contiguous().reshape(-1).cpu()
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest() if own else ""


def param_digests(model: torch.nn.Module) -> dict[str, str]:
    """name -> tensor_digest for every parameter (one pass over the weights)."""
    return {name: tensor_digest(p) for name, p in model.named_parameters()}


def model_key(model: torch.nn.Module | None = None, digests: dict[str, str] | None = None) -> str:
    """Content key of a model: digest over (name, dtype, shape, bytes) of every parameter."""
    digests = digests if digests is not None else param_digests(model)
    h = hashlib.blake2b(digest_size=8)
    for name, d in digests.items():
        h.update(f"{name}={d};".encode())
    return h.hexdigest()


def keep_for(need: int) -> int:
    k = MIN_KEEP
    while k < need:
        k *= 2
    return k


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive flock on `path` (created with its folder): one writer per cache folder across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def atomic_save(entry: dict, path: Path) -> None:
    """torch.save to a temporary file beside `path`, then rename: a reader never sees a partial file."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(entry, tmp)
    os.replace(tmp, path)


def load_entry(path: Path, digest: str) -> dict | None:
    """A cache file's dict if it exists, loads and was computed from the weight with this digest; else None
    (a corrupt or stale file is recomputed, never trusted)."""
    if not path.exists():
        return None
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    return d if d.get("digest") == digest else None


class SVDCache:
    """get(name, W, need) -> Spectrum of W with at least `need` vectors per side.

    root=None keeps spectra in memory only (tests); stats count hits/misses and compute seconds.
    """

    def __init__(self, root: str | Path | None, key: str):
        self.dir = Path(root) / key if root is not None else None
        self.key = key
        self._mem: dict[str, tuple[str, Spectrum]] = {}
        self.stats = {"hits": 0, "misses": 0, "svd_seconds": 0.0}

    def _file(self, name: str) -> Path:
        assert self.dir is not None
        return self.dir / f"{name}.pt"

    def get(self, name: str, W: torch.Tensor, need: int, digest: str | None = None) -> Spectrum:
        digest = digest or tensor_digest(W)
        if name in self._mem:
            d, spec = self._mem[name]
            if d == digest and spec.K >= min(need, spec.M):
                self.stats["hits"] += 1
                return spec.to(W.device)
        if self.dir is None:
            spec = self._compute(W, need)
            self._mem[name] = (digest, spec)
            return spec
        path = self._file(name)
        with file_lock(self.dir / ".lock"):
            spec = self._load(path, digest, need)
            if spec is None:
                spec = self._compute(W, need)
                atomic_save({"digest": digest, "shape": tuple(W.shape), "S": spec.S.cpu(),
                             "U_top": spec.U_top.cpu(), "Vh_top": spec.Vh_top.cpu(),
                             "U_bot": spec.U_bot.cpu(), "Vh_bot": spec.Vh_bot.cpu()}, path)
            else:
                self.stats["hits"] += 1
        self._mem[name] = (digest, spec)
        return spec.to(W.device)

    def _load(self, path: Path, digest: str, need: int) -> Spectrum | None:
        d = load_entry(path, digest)
        if d is None:
            return None
        spec = Spectrum(d["S"], d["U_top"], d["Vh_top"], d["U_bot"], d["Vh_bot"])
        if spec.K < min(need, spec.M):
            return None
        return spec

    def _compute(self, W: torch.Tensor, need: int) -> Spectrum:
        return timed_miss(self.stats, W, lambda: spectrum_of(W, keep_for(need)))


def timed_miss(stats: dict, W: torch.Tensor, compute: Any) -> Any:
    """A cache miss: ``compute()``'s result, its seconds (the device synchronised) added to ``stats``."""
    stats["misses"] += 1
    t0 = time.perf_counter()
    out = compute()
    if W.is_cuda:
        torch.cuda.synchronize(W.device)
    stats["svd_seconds"] += time.perf_counter() - t0
    return out
