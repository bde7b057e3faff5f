"""lorarl.evaluate.engines: `eval.backend` (auto | hf | vllm) resolved where the evaluation job starts; vllm where it
cannot run is refused before anything is written, never switched to hf."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lorarl.language.config import CellConfig
from lorarl.evaluate import engines
from lorarl.evaluate.engines import BACKENDS, resolve_backend
from lorarl.memory.ladder import eval_ladder
from lorarl.language.study import StudyError


@pytest.mark.parametrize("name, cuda, vllm, cpu_build, ran", [
    ("auto", True, True, False, "vllm"),   # vllm importable and a GPU: vllm
    ("auto", False, True, True, "hf"),     # no GPU (even with vLLM's CPU build): hf
    ("auto", True, False, False, "hf"),    # a GPU without vllm: hf
    ("hf", True, True, False, "hf"),
    ("vllm", True, True, False, "vllm"),
    ("vllm", False, True, True, "vllm"),   # vLLM's CPU build runs it on the CPU (tests/vllm_real)
])
def test_backend_resolved_from_what_the_machine_has(name, cuda, vllm, cpu_build, ran):
    assert resolve_backend(name, cuda=cuda, vllm=vllm, cpu_build=cpu_build) == ran


@pytest.mark.parametrize("cuda, vllm, why", [(False, True, "no CUDA GPU is visible"),
                                             (True, False, "the vllm package is not installed")])
def test_vllm_where_it_cannot_run_is_refused_naming_the_field_and_the_allowed(cuda, vllm, why):
    with pytest.raises(StudyError, match=f"eval.backend: 'vllm' cannot run here: {why}.*allowed: auto, hf, vllm"):
        resolve_backend("vllm", cuda=cuda, vllm=vllm, cpu_build=False)
    with pytest.raises(StudyError, match="eval.backend: 'vlm' is not allowed; allowed: auto, hf, vllm"):
        resolve_backend("vlm")


def test_a_bad_value_is_refused_by_the_config_naming_the_allowed():
    with pytest.raises(ValidationError, match="backend\n.*Input should be 'auto', 'hf' or 'vllm'"):
        CellConfig.model_validate({"eval": {"backend": "vlm"}})
    assert set(CellConfig.model_fields["eval"].annotation.model_fields["backend"].annotation.__args__) == set(BACKENDS)


def test_the_evaluation_job_refuses_vllm_before_writing_anything(tmp_path, monkeypatch):
    from lorarl.evaluate.main import evaluate_cell
    from lorarl.language.matrix import Cell

    monkeypatch.setattr(engines, "probe_vllm", lambda *probe: (False, True, False))  # vllm, no GPU, no CPU build
    cfg = CellConfig.model_validate({"eval": {"backend": "vllm"}})
    with pytest.raises(StudyError, match="no CUDA GPU is visible"):
        evaluate_cell("s", Cell("c", {}, cfg, "h"), tmp_path / "res")
    assert not (tmp_path / "res").exists()


def test_out_of_memory_retries_halve_the_batch_of_backends_that_batch():
    assert eval_ladder(64, "hf") == eval_ladder(64, "auto") == [64, 32, 16]
    assert eval_ladder(64, "vllm") == [64]  # vLLM pages its KV cache: no batch to halve


@pytest.mark.parametrize("backend, vllm, warned", [("hf", True, True), ("auto", False, True), ("auto", True, False),
                                                   ("vllm", True, False)])
def test_sampled_protocols_on_a_gpu_warn_where_hf_runs_them(monkeypatch, backend, vllm, warned):
    from lorarl.evaluate.vllm_backend import sampled_on_hf

    monkeypatch.setattr(engines, "probe_vllm", lambda cuda, v, cpu: (cuda, vllm, False))
    cfg = CellConfig.model_validate({"eval": {"backend": backend, "benchmarks": {"synthetic": {
        "protocol": {"temperature": 0.6, "n": 4, "ks": [1, 4]}}}}})
    assert bool(sampled_on_hf(cfg)) == warned
