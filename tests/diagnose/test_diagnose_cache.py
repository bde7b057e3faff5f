"""lorarl.diagnose.cache: W0's factors computed once per base and shared by cells and concurrent jobs."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from lorarl.diagnose import weights as dg
from lorarl.diagnose.cache import BaseCache

NAMES = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")


def _weights():
    g = torch.Generator().manual_seed(3)
    return {NAMES[0]: torch.randn(48, 32, generator=g), NAMES[1]: torch.randn(32, 56, generator=g)}


def _job(root, out):
    """One diagnose job's use of the cache: every base matrix once; reports what it computed."""
    torch.set_num_threads(1)
    cache = BaseCache(root, "base-key")
    for name, w in _weights().items():
        cache.get(name, w, 16)
    out.put(cache.stats["misses"])


def test_two_concurrent_jobs_compute_each_base_matrix_once(tmp_path):
    ctx = mp.get_context("fork")  # two jobs racing on one cache folder (fork: no re-import, seconds)
    q = ctx.Queue()
    procs = [ctx.Process(target=_job, args=(str(tmp_path), q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted([q.get(timeout=5), q.get(timeout=5)]) in ([0, 2], [1, 1])  # one SVD per matrix in all
    files = sorted(f.name for f in (tmp_path / "base-key" / "diagnose").iterdir())
    assert files == [".lock", *sorted(f"{n}.pt" for n in NAMES)]  # no temporary file left behind
    third = BaseCache(tmp_path, "base-key")  # the next cell of the study reads them
    for name, w in _weights().items():
        base = third.get(name, w, 16)
        ref = dg.base_factors(w, keep=64)
        assert torch.allclose(base.S_M, ref.S_M, rtol=1e-12) and base.right == ref.right
        assert base.F_XM.shape == (min(w.shape), min(w.shape)) and base.K == min(w.shape)  # the M×M side only
    assert third.stats == {"hits": 2, "misses": 0, "svd_seconds": 0.0}


def test_changed_weight_or_larger_need_recomputes(tmp_path):
    w = _weights()[NAMES[0]]
    BaseCache(tmp_path, "k").get(NAMES[0], w, 16)
    again = BaseCache(tmp_path, "k")
    again.get(NAMES[0], w + 1e-3, 16)  # another weight under the same name: its digest differs
    assert again.stats["misses"] == 1
    (tmp_path / "k" / "diagnose" / f"{NAMES[0]}.pt").write_bytes(b"corrupt")
    third = BaseCache(tmp_path, "k")
    assert third.get(NAMES[0], w, 16).K == 32 and third.stats["misses"] == 1


def test_big_matrix_keeps_top_and_bottom_k_only():
    w = torch.randn(160, 140, generator=torch.Generator().manual_seed(1))
    base = BaseCache(None, "k").get("m", w, 16)
    assert base.K == 64 and base.U_top_DK.shape == (160, 64) and base.Vh_bot_KN.shape == (64, 140)
    assert base.F_XM.shape == (140, 140) and base.right  # V (N×N) kept in full, U derived from W0
    with pytest.raises(ValueError, match="needs 80 base singular vectors, 64 kept"):
        dg.diagnose_matrix("m", w, w + 1e-2, torch.randn(80, 140), k=4, base=base)
