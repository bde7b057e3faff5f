"""Evaluation stage: benchmarks, protocols, generation backends and per-sample records.

* :mod:`.protocols`: greedy pass@1, avg@k, unbiased pass@k, Wilson intervals, ``Protocol``;
* :mod:`.benchmarks`: the benchmark registry (hub or local loaders, templates, graders);
* :mod:`.backends`: ``HFBackend`` (transformers, CPU/GPU, peft adapters merged or not);
* :mod:`.vllm_backend`: ``VLLMBackend`` (a GPU or vLLM's CPU build, imported on demand);
* :mod:`.records`: per-sample jsonl, summary json, ``rescore``, ``run_benchmark``.

Importing this package does not import torch, transformers or vllm.
"""

from lorarl.evaluate.backends import Completion, HFBackend
from lorarl.evaluate.benchmarks import BENCHMARKS, Benchmark, Problem, get_benchmark
from lorarl.evaluate.protocols import Metric, Protocol, summarize
from lorarl.evaluate.records import Sample, rescore, run_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "Completion", "HFBackend", "Metric", "Problem", "Protocol",
           "Sample", "get_benchmark", "rescore", "run_benchmark", "summarize"]
