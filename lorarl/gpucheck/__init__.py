"""`python -m lorarl.gpucheck`: the acceptance run for a GPU node (no network, one command).

Builds real-shape, randomly initialised models from configs written here (Qwen2.5-1.5B and Qwen3-1.7B
dimensions; a 7B config with ``--large``; a tokenizer trained locally), then runs ``lorarl doctor`` on
twins of ``reward_density`` and ``peft_zoo`` at their shapes, a packed K = 4 job against 4 solo jobs, the
evaluation backend, and (when ``import vllm`` works) the same through vLLM. Writes gpucheck.md and
gpucheck.json. ``--cpu-smoke`` runs the same code path at tiny shapes on a CPU (what CI tests).
"""
