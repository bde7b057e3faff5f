"""Evaluation stage: generation backends and per-sample records (the benchmark registry, protocols and
graders it runs live below it, in :mod:`lorarl.grading`; a cell's evaluation plan in :mod:`lorarl.language.evalplan`).

* :mod:`.backends`: ``HFBackend`` (transformers, CPU/GPU, peft adapters merged or not);
* :mod:`.vllm_backend`: ``VLLMBackend`` (a GPU or vLLM's CPU build, imported on demand);
* :mod:`.engines`: ``eval.backend`` (auto | hf | vllm) resolved where the job starts, vllm refused where it cannot run;
* :mod:`.records`: per-sample jsonl, summary json, ``rescore``, ``run_benchmark``;
* :mod:`.main`: the stage's entry point (one cell's benchmarks, MLflow, the summary).

Importing this package does not import torch, transformers or vllm.
"""

from lorarl.evaluate.backends import Completion, HFBackend
from lorarl.evaluate.records import Sample, rescore, run_benchmark

__all__ = ["Completion", "HFBackend", "Sample", "rescore", "run_benchmark"]
