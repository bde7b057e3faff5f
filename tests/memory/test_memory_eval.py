"""The evaluation jobs' memory plan (lorarl.memory.evaluation): the KV cache of the longest budget, the knob that
fixes it, `lorarl memory`'s evaluation table, `lorarl doctor`'s check and the
vLLM studies' `GPU memory` fidelity rows."""

from __future__ import annotations

import contextlib
import re
import io
from pathlib import Path

import pytest

from lorarl.cli import main
from lorarl.memory.arch import arch_for
from lorarl.language.evalplan.lengths import longest_budget, sequence_tokens
from lorarl.memory.evaluation import device_eval_check, eval_peak, kv_bytes_per_token, plan_eval
from lorarl.memory.plan import GIB
from lorarl.language.study import load_study, study_cells

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
PISSA = EXPERIMENTS / "off_principal_lora_pissa.yaml"


def _cells(path: Path) -> dict:
    return {c.axes.get("model"): c.config for c in study_cells(load_study(path))}


def test_kv_cache_per_token_from_the_architecture():
    qwen = arch_for("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")      # 28 layers, 2 KV heads of 128
    llama = arch_for("meta-llama/Llama-3.2-3B-Instruct")               # 28 layers, 8 KV heads of 128
    assert kv_bytes_per_token(qwen) == 28 * 2 * 2 * 128 * 2 == 28_672
    assert kv_bytes_per_token(llama) == 4 * kv_bytes_per_token(qwen)
    one, two = eval_peak(qwen, 33_792, 1024, 1), eval_peak(qwen, 33_792, 1024, 2)
    assert two["kv_cache"] == 2 * one["kv_cache"] == 2 * 33_792 * 28_672 and two["weights"] == one["weights"]


def _hf(cfg, batch_size: int):
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"backend": "hf", "batch_size": batch_size})})


def _hf_study(tmp_path: Path) -> Path:
    """The 004 study evaluated with HF generate at eval.batch_size 64: DS-Qwen's 64 fit 80 GiB, Llama's do not."""
    wide = tmp_path / "wide.yaml"
    text = PISSA.read_text()
    assert text.count("    backend: vllm ") == 1
    wide.write_text(text.replace("    backend: vllm ", "    batch_size: 64\n    backend: hf "))
    return wide


def test_004_evaluates_32k_tokens_and_the_plan_sizes_its_batches():
    cfgs = _cells(PISSA)
    qwen, llama = cfgs["dsqwen"], cfgs["llama"]
    assert longest_budget(qwen) == ("aime24_evalchemy", 32_768) and longest_budget(llama) == ("math500_evalchemy", 32_768)
    p = plan_eval(qwen, 80)                                             # the study's engine: vLLM's paged pool
    assert p.backend == "vllm" and p.fits and p.tokens == 1024 + 32_768 and p.batch == 76
    assert plan_eval(llama, 80).batch == 18                             # 3.6 GiB of KV per Llama sequence
    p = plan_eval(_hf(qwen, 64), 80)                                    # HF generate: eval.batch_size at once
    assert p.fits and p.batch == 64 and p.max_batch >= 64
    assert 55 < p.kv_gb < 60                                            # 64 x 33,792 x 28 KiB
    p = plan_eval(_hf(llama, 16), 80)
    assert p.fits and p.batch == 16 and p.max_batch == 17
    wide = _hf(llama, 64)
    p = plan_eval(wide, 80)
    assert not p.fits and p.knobs[0].startswith("eval.batch_size: 17 ")
    assert plan_eval(wide, 141).max_batch > 17                          # an H200 holds more at once
    short = wide.model_copy(update={"eval": wide.eval.model_copy(update={"max_new_tokens": 8192})})
    assert plan_eval(short, 80).max_batch > 4 * 17 - 20                 # a quarter of the tokens: about 4x the batch


def test_vllm_backend_is_planned_as_its_paged_pool():
    qwen = _cells(PISSA)["dsqwen"]
    v = qwen.model_copy(update={"eval": qwen.eval.model_copy(update={"backend": "vllm"})})
    p = plan_eval(v, 80)
    weights = arch_for(qwen.model).params() * 2
    assert p.fits and p.batch == int((0.9 * 80 * GIB - weights) // (33_792 * 28_672))
    tiny = plan_eval(v, 4)                                              # 3.3 GiB of weights leave no 0.9 GiB sequence
    assert not tiny.fits and tiny.batch == 0 and "a GPU with more memory" in tiny.knobs[0]


def test_vllm_plan_is_the_engines_start_up_check_at_the_evaluations_max_model_len():
    """The evaluation's engine starts with max_model_len = the plan's sequence (lorarl.evaluate.main.make_backend), and
    vLLM starts only when its pool holds one such sequence: on 20 GiB a Llama-3.2-3B pool (12 GiB) holds three of
    the 004 study's 33,792 tokens, where one sequence of the model's whole context (131,072 tokens, 14 GiB) would not."""
    llama = _cells(PISSA)["llama"]
    p = plan_eval(llama, 20)
    pool = 0.9 * 20 * GIB - arch_for(llama.model).params() * 2
    per_token = kv_bytes_per_token(arch_for(llama.model))
    assert p.tokens == sequence_tokens(llama) == 1024 + 32_768 and pool < 131_072 * per_token
    assert p.fits and p.batch == int(pool // (33_792 * per_token)) == 3 and "(max_model_len 33,792)" in p.notes[-1]
    p = plan_eval(llama, 10)                                            # a 3.0 GiB pool: not one 3.6 GiB sequence
    assert not p.fits and p.batch == 0 and "one sequence of max_model_len 33,792 tokens" in p.knobs[0]


def _memory(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["memory", *argv])
    return rc, out.getvalue()


def test_cli_prints_the_evaluation_jobs_and_fails_when_one_does_not_fit(tmp_path):
    rc, out = _memory(str(PISSA), "--gpu-memory-gb", "80")
    assert rc == 0 and "evaluation jobs:" in out and "33,792" in out and "math500_evalchemy" in out
    assert "vLLM pages the KV cache: 76 sequence(s) of 33,792 tokens at once" in out
    rc, out = _memory(str(_hf_study(tmp_path)), "--gpu-memory-gb", "80")
    assert rc == 1 and "evaluation does not fit; fix: eval.batch_size: 17" in out
    assert "NO" not in out.split("evaluation jobs")[0]                 # training fits: the exit status is the evaluation's


def test_doctor_check_fails_on_a_gpu_and_reports_on_a_cpu(tmp_path):
    wide = _hf_study(tmp_path)
    plans, line = device_eval_check(str(PISSA), "cuda", 80.0)
    assert len(plans) == 2 and all(p["fits"] for p in plans) and "vllm 76 x 33,792 tokens" in line
    with pytest.raises(ValueError, match="evaluation does not fit this GPU.*eval.batch_size: 17"):
        device_eval_check(str(wide), "cuda", 80.0)
    plans, line = device_eval_check(str(wide), "cpu", 80.0)
    assert line.startswith("CPU (host memory, not checked)") and not all(p["fits"] for p in plans)


VLLM_STUDIES = ["peft_zoo", "peft_zoo_7b", "peft_zoo_ablations", "init_geometry", "init_geometry_7b",
                "off_principal_masks", "off_principal_lora_pissa"]


@pytest.mark.parametrize("stem", VLLM_STUDIES)
def test_the_gpu_memory_row_quotes_the_vllm_evaluation_plan(stem):
    """Each GPU study evaluated on vLLM quotes its evaluation plan in its fidelity table's `GPU memory` row: the
    engine's sequence length, the whole sequences its pool holds on 80 GiB, their KV cache and the H200's count, as
    `lorarl memory` prints them (a study moved to vLLM, or a plan changed, without its row fails here)."""
    from tests.support.published import fidelity_table

    path = EXPERIMENTS / f"{stem}.yaml"
    row = " ".join(fidelity_table(path)["gpu memory"])
    shapes = {(p.tokens, p.batch, round(p.kv_gb, 1), q.batch)
              for cfg in {c.config.model: c.config for c in study_cells(load_study(path))}.values()
              for p, q in [(plan_eval(cfg, 80), plan_eval(cfg, 141))]}
    assert {p.backend for c in study_cells(load_study(path)) for p in [plan_eval(c.config, 80)]} == {"vllm"}
    for tokens, batch, kv, h200 in shapes:
        assert f"{tokens:,}" in row and re.search(rf"\b{batch} (whole|\()", row), (stem, tokens, batch)
        assert f"{kv:.1f} GiB" in row and f"H200: {h200})" in row, (stem, kv, h200)
