"""vLLM multi-LoRA request building of a pack (lorarl.pack.multilora) against tests/support/fake_vllm.py: one engine,
one generate call, one LoRARequest per member, per-prompt lists, each member's own seed stream; the fake
refuses what vLLM 0.31 refuses (list lengths, ranks above max_lora_rank, LoRA without enable_lora)."""

from __future__ import annotations

import pytest
import torch

from tests.support import fake_vllm
from tests.support.grpo import load
from tests.support.multilora import save_adapter, settings


def test_one_engine_one_call_routes_each_members_prompts_to_its_adapter(tiny_dir, tmp_path, monkeypatch):
    from lorarl.pack.multilora import build_requests, engine_lora_kwargs, generate_multilora, lora_requests

    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)
    api = fake_vllm.api()
    _, tok = load(tiny_dir)
    dirs = [save_adapter(tiny_dir, tmp_path / n, s) for n, s in (("a", 1), ("b", 2))]
    kw = engine_lora_kwargs([4, 4])
    assert kw == {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4}
    llm = api.LLM(str(tiny_dir), **kw)
    loras = lora_requests(api, ["a", "b"], dirs)
    assert [r.lora_int_id for r in loras] == [1, 2] and not any(r.load_inplace for r in loras)
    prompts = [tok("Q: 1+2=?\nA: ")["input_ids"], tok("Q: 3+4=?\nA: ")["input_ids"]]
    s = settings(tok)
    req = build_requests(api, loras, [prompts, prompts], [torch.Generator().manual_seed(5),
                                                              torch.Generator().manual_seed(5)], s, generations=3)
    assert len(req.prompts) == len(req.params) == len(req.loras) == 4 and req.owner == [0, 0, 1, 1]
    assert [p.n for p in req.params] == [3] * 4 and req.params[0].seed == req.params[2].seed  # same seed streams
    out = generate_multilora(llm, req, 2)
    assert llm.generate_calls == 1 and llm.adapter_loads == 2  # one call, each adapter loaded once
    assert all(len(o.completion_ids) == 6 and len(o.prompt_ids) == 6 for o in out)
    # same prompts, same seeds: only the adapter differs, so the members' samples differ
    assert out[0].completion_ids != out[1].completion_ids
    # member b alone asks for the same requests it had in the pack: its prompts, its adapter, its seeds. vLLM
    # does not promise batch invariance (batch composition changes kernels and numerics), so what is tested is
    # the requests, not bit-equal samples.
    alone = build_requests(api, [None, lora_requests(api, ["b"], dirs[1:])[0]], [None, prompts],
                           [None, torch.Generator().manual_seed(5)], s, generations=3)
    packed_b = [i for i, k in enumerate(req.owner) if k == 1]
    assert alone.owner == [1, 1] and [req.prompts[i] for i in packed_b] == alone.prompts
    assert [req.params[i].seed for i in packed_b] == [p.seed for p in alone.params]
    assert {req.loras[i].lora_path for i in packed_b} == {r.lora_path for r in alone.loras} == {dirs[1]}


def test_fake_refuses_what_vllm_refuses(tiny_dir, tmp_path):
    from lorarl.pack.multilora import engine_lora_kwargs, lora_requests

    api = fake_vllm.api()
    big = save_adapter(tiny_dir, tmp_path / "big", 3, r=16)
    small = save_adapter(tiny_dir, tmp_path / "small", 4)
    llm = api.LLM(str(tiny_dir), **engine_lora_kwargs([4]))
    p = [{"prompt_token_ids": [5, 6, 7]}] * 2
    reqs = lora_requests(api, ["s", "b"], [small, big])
    with pytest.raises(fake_vllm.VLLMValidationError, match=r"lengths of prompts \(2\) and lora_request \(1\)"):
        llm.generate(p, api.SamplingParams(max_tokens=2), lora_request=reqs[:1])
    with pytest.raises(fake_vllm.VLLMValidationError, match=r"lengths of prompts \(2\) and params \(1\)"):
        llm.generate(p, [api.SamplingParams(max_tokens=2)], lora_request=reqs[0])
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        llm.generate(p, api.SamplingParams(max_tokens=2), lora_request=reqs)
    fake_vllm.fresh_process()  # each engine below in a process of its own (vLLM: one engine per process)
    with pytest.raises(fake_vllm.VLLMValidationError, match="LoRA is not enabled"):  # vLLM's: not a ValueError
        api.LLM(str(tiny_dir)).generate(p[:1], api.SamplingParams(max_tokens=2), lora_request=reqs[0])
    with pytest.raises(ValueError, match="largest max_lora_rank"):
        engine_lora_kwargs([600])
    with pytest.raises(ValueError, match="unique"):
        lora_requests(api, ["s", "s"], [small, small])


def test_engine_limits_come_from_the_saved_adapters(tiny_dir, tmp_path):
    """A residual-init member is saved converted at rank 2r: the engine's max_lora_rank comes from the saved
    adapter config (the cell's r would make vLLM refuse the load); an adapter vLLM cannot serve is refused
    up front by the project's own lora_servable, naming the member."""
    import json

    from lorarl.pack.multilora import engine_lora_kwargs, lora_requests, saved_engine_lora_kwargs

    api = fake_vllm.api()
    cell_r = 8
    dirs = [save_adapter(tiny_dir, tmp_path / "lora", 1, r=cell_r), save_adapter(tiny_dir, tmp_path / "res", 2, r=2 * cell_r)]
    kw = saved_engine_lora_kwargs(["lora", "pissa"], dirs)
    assert kw["max_lora_rank"] == 16 and kw["max_loras"] == 2
    p = [{"prompt_token_ids": [5, 6, 7]}] * 2
    reqs = lora_requests(api, ["lora", "pissa"], dirs)
    with pytest.raises(ValueError, match="greater than max_lora_rank"):  # the cell's rank as the limit: refused
        api.LLM(str(tiny_dir), **engine_lora_kwargs([cell_r, cell_r])).generate(
            p, api.SamplingParams(max_tokens=2), lora_request=reqs)
    fake_vllm.fresh_process()
    out = api.LLM(str(tiny_dir), **kw).generate(p, api.SamplingParams(max_tokens=2), lora_request=reqs)
    assert len(out) == 2
    cfg_path = tmp_path / "res" / "adapter_config.json"
    for change, why in (({"use_dora": True}, "DoRA"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                        ({"lora_bias": True}, "bias"), ({"r": 600}, "rank 600")):
        saved = json.loads(cfg_path.read_text())
        cfg_path.write_text(json.dumps({**saved, **change}))
        with pytest.raises(ValueError, match=f"pack member pissa: .*{why}"):
            saved_engine_lora_kwargs(["lora", "pissa"], dirs)
        cfg_path.write_text(json.dumps(saved))


def test_each_members_adapter_is_read_once_per_training_step(tiny_dir, tmp_path, monkeypatch):
    """vLLM re-applies a running request's adapter at every engine step and re-reads an in-place one from disk each
    time (the fake counts it: one read per decoded token); EngineAdapters swaps in each step's adapters under fresh
    ids, so the engine reads each member's folder once per training step, whatever the completion length."""
    from lorarl.pack.multilora import EngineAdapters, build_requests, engine_lora_kwargs, generate_multilora

    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)
    api = fake_vllm.api()
    _, tok = load(tiny_dir)
    llm = api.LLM(str(tiny_dir), **engine_lora_kwargs([4, 4]))
    prompts = [tok("Q: 1+2=?\nA: ")["input_ids"]]
    s = settings(tok)
    adapters = EngineAdapters(api, llm, ["a", "b"])
    outs = []
    for step in range(3):  # three training steps: each saves new adapters, then samples
        dirs = [save_adapter(tiny_dir, tmp_path / f"{n}{step}", 10 * step + k) for k, n in enumerate("ab")]
        loras = adapters.update(dirs)
        assert llm.adapter_loads == 2 * (step + 1) and llm.llm_engine.list_loras() == {r.lora_int_id for r in loras}
        req = build_requests(api, loras, [prompts, prompts], [torch.Generator().manual_seed(5)] * 2, s, generations=2)
        outs.append(generate_multilora(llm, req, 2))
        assert llm.adapter_loads == 2 * (step + 1)  # sampling 6 tokens read nothing more
    assert [r.lora_name for r in loras] == ["a@2", "b@2"] and [r.lora_int_id for r in loras] == [5, 6]
    assert outs[0][0].completion_ids != outs[1][0].completion_ids  # the new step's adapter is the one sampled
    # the in-place design it replaces: the same id every step, re-read at every engine step
    inplace = [api.LoRARequest(lora_name=r.lora_name, lora_int_id=r.lora_int_id, lora_path=r.lora_path, load_inplace=True)
               for r in loras]
    before = llm.adapter_loads
    out = generate_multilora(llm, build_requests(api, inplace, [prompts, prompts], [torch.Generator().manual_seed(5)] * 2,
                                                 s, generations=2), 2)
    assert llm.adapter_loads - before == 2 * max(len(c) for c in out[0].completion_ids) == 12


def test_a_failed_load_keeps_the_previous_adapters_whole(tiny_dir, tmp_path, monkeypatch):
    """EngineAdapters swaps staged and atomic: a step whose second member's adapter fails to load leaves the
    engine holding the previous step's adapters (none of the new ones), its requests unchanged and serving the
    same samples; the failed step's ids are never used again."""
    from lorarl.pack.multilora import (AdapterState, EngineAdapters, build_requests, engine_lora_kwargs,
                                       generate_multilora)

    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)
    api = fake_vllm.api()
    _, tok = load(tiny_dir)
    llm = api.LLM(str(tiny_dir), **engine_lora_kwargs([4, 4]))
    prompts = [tok("Q: 1+2=?\nA: ")["input_ids"]]
    adapters = EngineAdapters(api, llm, ["a", "b"])

    def sample(loras):
        req = build_requests(api, loras, [prompts, prompts], [torch.Generator().manual_seed(5)] * 2, settings(tok), 2)
        return [c.completion_ids for c in generate_multilora(llm, req, 2)]

    old = adapters.update([save_adapter(tiny_dir, tmp_path / n, k) for k, n in enumerate("ab")])
    before = sample(old)
    good = save_adapter(tiny_dir, tmp_path / "a1", 7)
    with pytest.raises(FileNotFoundError):
        adapters.update([good, str(tmp_path / "never-saved")])
    assert adapters.requests is old and adapters.version == 0
    assert llm.llm_engine.list_loras() == {1, 2}  # the new "a" (id 3) went back out with the failed "b"
    assert sample(adapters.requests) == before
    new = adapters.update([good, save_adapter(tiny_dir, tmp_path / "b1", 8)])
    assert [r.lora_int_id for r in new] == [5, 6] and [r.lora_name for r in new] == ["a@1", "b@1"]
    assert llm.llm_engine.list_loras() == {5, 6} and sample(new) != before
    with pytest.raises(TypeError, match="not a mix"):
        adapters.update([good, AdapterState({}, {})])


@pytest.mark.parametrize("init", ["gaussian", "pissa"])
def test_the_in_memory_adapter_is_what_save_writes(tiny_dir, tmp_path, init):
    """adapter_state (the tensors a pack hands to vLLM from memory) equals the saved folder: the same tensors
    and the LoRA fields vLLM reads from adapter_config.json (a residual init converted at rank 2r in both)."""
    import json

    from safetensors.torch import load_file

    from lorarl.adapters import build_adapter
    from lorarl.adapters.build import adapter_state
    from lorarl.language.config import AdapterConfig, CellConfig

    model, _ = load(tiny_dir)
    policy = build_adapter(model, CellConfig(model="local:tiny", adapter=AdapterConfig(method="lora", rank=4, init=init)))
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_" in n:
                p.add_(0.01)  # a trained step's change
    tensors, config = adapter_state(policy)
    saved = load_file(str(policy.save(tmp_path / "ad") / "adapter_model.safetensors"))
    assert tensors.keys() == saved.keys() and all(torch.equal(tensors[k], saved[k]) for k in saved)
    on_disk = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    fields = ("r", "lora_alpha", "use_rslora", "use_dora", "bias", "modules_to_save", "peft_type")
    assert {k: config[k] for k in fields} == {k: on_disk[k] for k in fields}
    assert sorted(config["target_modules"]) == sorted(on_disk["target_modules"])
    assert config["r"] == (8 if init == "pissa" else 4)
    next(p for n, p in policy.model.named_parameters() if "lora_B" in n).data.add_(1.0)
    assert all(torch.equal(tensors[k], saved[k]) for k in saved)  # copies: training on does not change them
    again, _ = adapter_state(policy, out=tensors)  # the next step's, copied into these (no new memory)
    assert all(again[k] is tensors[k] for k in saved) is (init != "pissa")  # a residual conversion is new tensors
    assert any(not torch.equal(again[k], saved[k]) for k in saved)
    assert all(torch.equal(again[k], v) for k, v in adapter_state(policy)[0].items())
