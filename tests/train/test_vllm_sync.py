"""lorarl.train.vllm_sync without vLLM: the push goes through the model runner's reload_weights with the whole
state, and the tied-weight groups (a tied LM head) are the modules whose processing is re-run on the CPU build.
tests/vllm_real/test_train_vllm.py runs the same push on vLLM's real CPU engine."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lorarl.train.vllm_sync import push_weights
from lorarl.vllm_push import reprocess_tied_weights


class _Method:
    def __init__(self):
        self.processed: list[torch.nn.Module] = []

    def process_weights_after_loading(self, layer):
        self.processed.append(layer)


def _tied_model():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = model.embed.weight  # tied
    model.proj = torch.nn.Linear(4, 4)
    method = _Method()
    for m in (model.embed, model.head, model.proj):
        m.quant_method = method
    return model, method


def test_only_tied_groups_are_reprocessed():
    model, method = _tied_model()
    assert reprocess_tied_weights(model) == [["embed", "head"]]
    assert method.processed == [model.embed, model.head]


def test_push_hands_the_whole_state_to_reload_weights_then_drops_the_prefix_cache():
    calls = []
    runner = SimpleNamespace(reload_weights=lambda **kw: calls.append(("reload", list(kw["weights_iterator"]),
                                                                         kw["is_checkpoint_format"])))
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=SimpleNamespace(
        driver_worker=SimpleNamespace(model_runner=runner))), reset_prefix_cache=lambda: calls.append(("reset",)))
    state = [("a.weight", torch.ones(2)), ("b.weight", torch.zeros(3))]
    push_weights(llm, (kv for kv in state))
    assert calls == [("reload", state, True), ("reset",)]
