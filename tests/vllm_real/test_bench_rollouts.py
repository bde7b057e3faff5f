"""bench/vllm_rollouts.py keeps running on vLLM's real CPU engine: its --quick mode (own process: one engine per
process) prints the HF/vLLM table and writes figures of the documented shape (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_real
ROOT = Path(__file__).parents[2]


def test_quick_bench_measures_both_engines_and_the_push(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_rollouts.py"), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "vLLM / HF tokens/s:" in p.stdout and "push per step (" in p.stdout
    r = json.loads(out.read_text())
    assert r["push_path"] in ("lorarl.train.vllm_sync.push_weights", "model_runner.reload_weights (direct)")
    c = r["cell"]
    rows = c["prompts"] * c["generations"]
    for engine in ("hf", "vllm"):  # the same batch: every row sampled, none past the budget, at least one token
        assert rows <= r["tokens"][engine]["min"] <= r["tokens"][engine]["max"] <= rows * c["max_tokens"]
        for per in ("tokens_per_s", "tokens_per_cpu_s"):
            t = r[per][engine]
            assert 0 < t["min"] <= t["median"] <= t["max"] and t["n"] == 1
    for per, k in (("tokens_per_s", "wall"), ("tokens_per_cpu_s", "cpu")):  # one pair: the ratio of its two rates
        assert r["ratio_vllm_over_hf"][k]["median"] == pytest.approx(r[per]["vllm"]["median"] / r[per]["hf"]["median"])
    assert set(r["push_s"]) == {"full", "lora"}
    for kind in r["push_s"].values():
        assert {"merge", "reload", "total", "total_cpu"} == set(kind)
        assert kind["total"]["n"] == 2 and kind["reload"]["median"] > 0 and kind["total_cpu"]["median"] > 0
    assert r["push_s"]["lora"]["merge"]["median"] > r["push_s"]["full"]["merge"]["median"]  # LoRA layers merged
