"""The vLLM evaluation backend against tests/support/fake_vllm.py (vLLM 0.31.0's API surface, strict), and the
loud warning for sampled protocols evaluated with HF generate on a GPU."""

from __future__ import annotations

import json

import pytest

from tests.support import fake_vllm
from lorarl.language.config import CellConfig
from lorarl.language.evalplan.lengths import sequence_tokens
from lorarl.evaluate.backends import HFBackend
from lorarl.grading.protocols import Protocol
from lorarl.evaluate.vllm_backend import VLLMBackend, lora_servable, sampled_on_hf, sampling_kwargs, warn_sampled_on_hf
from tests.support.eval_backends import PROMPTS

GREEDY = Protocol.greedy(max_new_tokens=6)


def test_fake_refuses_what_vllm_refuses(tiny):
    api = fake_vllm.api()
    with pytest.raises(TypeError):
        api.LLM(str(tiny["base"]), max_lora_ranks=8)  # typo: not an EngineArgs field
    with pytest.raises(ValueError, match="max_lora_rank"):
        api.LLM(str(tiny["base"]), enable_lora=True, max_lora_rank=4)
    with pytest.raises(fake_vllm.VLLMValidationError, match="temperature"):  # not a ValueError in vLLM 0.31
        api.SamplingParams(temperature=2.5)
    with pytest.raises(TypeError, match="top_k"):
        api.SamplingParams(top_k=None)
    with pytest.raises(TypeError):
        api.SamplingParams(max_new_tokens=10)  # transformers' name, not vLLM's
    with pytest.raises(ValueError):
        api.LoRARequest("a", 0, "x")


def test_lora_served_with_a_request_matches_hf(tiny):
    backend = VLLMBackend(tiny["base"], tiny["lora"], api=fake_vllm.api(), seed=0, max_model_len=256)
    assert backend.llm.kwargs["max_lora_rank"] == 8 and backend.lora_request.lora_int_id == 1
    out = backend.generate(PROMPTS, GREEDY)
    assert [len(x) for x in out] == [1, 1, 1]
    # the fake applies no adapter: compared with the BASE model's greedy output (the request was accepted)
    assert [x[0].text for x in out] == [x[0].text for x in HFBackend(tiny["base"]).generate(PROMPTS, GREEDY)]
    sampled = backend.generate(PROMPTS[:1], Protocol.sampling(3, max_new_tokens=5), seed=7)
    assert len(sampled[0]) == 3 and all(c.n_tokens <= 5 for c in sampled[0])


def test_dora_is_merged_and_served_as_a_plain_model(tiny, tmp_path):
    backend = VLLMBackend(tiny["base"], tiny["dora"], merge_dir=tmp_path / "m", api=fake_vllm.api())
    assert backend.lora_request is None and "enable_lora" not in backend.llm.kwargs
    got = [x[0].text for x in backend.generate(PROMPTS, GREEDY)]
    assert got == [x[0].text for x in HFBackend(tiny["base"], tiny["dora"]).generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("change,why", [({"bias": "all"}, "bias"), ({"lora_bias": True}, "bias"),
                                        ({"rank_pattern": {"q_proj": 8}}, "pattern"),
                                        ({"target_modules": ["q_proj", "lm_head"]}, "lm_head"),
                                        ({"modules_to_save": ["lm_head"]}, "modules_to_save")])
def test_adapters_vllm_cannot_serve_are_merged(tiny, tmp_path, change, why):
    d = tmp_path / "a"
    d.mkdir()
    cfg = json.loads((tiny["lora"] / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**cfg, **change}))
    ok, reason = lora_servable(d)
    assert not ok and why in reason


def test_sampling_kwargs_are_accepted_by_vllm():
    for p in (GREEDY, Protocol.sampling(32, max_new_tokens=32768)):
        fake_vllm.SamplingParams(**sampling_kwargs(p, seed=3))
    with pytest.raises(ValueError, match=r"\[0, 2\.0\]"):
        sampling_kwargs(Protocol.sampling(4, temperature=2.5), 0)


def test_sampled_protocols_on_hf_warn_loudly_on_a_gpu(capsys):
    cfg = CellConfig.model_validate({"task": {"name": "dataset", "path": "x.jsonl"},
                                     "eval": {"benchmarks": {"aime24": {}, "gsm8k": {}}}})
    lines = sampled_on_hf(cfg)
    assert len(lines) == 1 and lines[0].startswith("aime24: n=32") and "32768" in lines[0]
    with pytest.warns(UserWarning, match="aime24"):
        warn_sampled_on_hf(cfg, cuda=True)
    assert "eval.backend: vllm" in capsys.readouterr().err
    assert warn_sampled_on_hf(cfg, cuda=False) == []  # CPU runs: HF is the only engine
    vcfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"backend": "vllm"})})
    assert sampled_on_hf(vcfg) == []


def test_each_problem_and_sample_draws_its_own_noise(tiny):
    """Real vLLM seeds a seeded request's generator with its seed (child j of an n > 1 request: seed + j): one seed
    shared by every problem would give every problem the same noise, so its samples are correlated across problems
    and the intervals too narrow. Identical problems must therefore draw different samples; a cell seed replays."""
    backend = VLLMBackend(tiny["base"], api=fake_vllm.api(), seed=0, max_model_len=256)
    protocol = Protocol.sampling(4, temperature=1.0, max_new_tokens=8)
    texts = [[c.text for c in req] for req in backend.generate([PROMPTS[0]] * 3, protocol, seed=5)]
    assert texts[0] != texts[1] != texts[2] != texts[0]  # same problem, three positions: independent draws
    assert len(set(texts[0])) > 1  # the samples of one problem differ too
    again = [[c.text for c in req] for req in backend.generate([PROMPTS[0]] * 3, protocol, seed=5)]
    assert again == texts  # the cell seed replays the evaluation
    other = [[c.text for c in req] for req in backend.generate([PROMPTS[0]] * 3, protocol, seed=6)]
    assert other != texts


# ------------------------------------------------------------------ one engine per evaluation job
def test_fake_refuses_a_second_engine_in_a_process(tiny):
    """vLLM does not free an engine's GPU memory on `del`: a second engine fails its startup memory check."""
    api = fake_vllm.api()
    first = api.LLM(str(tiny["base"]))
    del first
    with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
        api.LLM(str(tiny["base"]))


def _greedy(backend):
    return [x[0].text for x in backend.generate(PROMPTS, GREEDY)]


def test_lora_snapshots_share_one_engine_as_lora_requests(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)  # the fake applies each request's adapter
    second = _second_lora(tiny, tmp_path)
    plan = [(tiny["base"], tiny["lora"]), (tiny["base"], second), (tiny["base"], None)]
    backend = VLLMBackend(tiny["base"], tiny["lora"], plan=plan, api=fake_vllm.api(), max_model_len=256)
    assert backend.mode == "lora" and backend.llm.kwargs["max_lora_rank"] == 16  # the largest rank (12) fits
    got = [_greedy(backend)]
    backend.select(tiny["base"], second)
    got.append(_greedy(backend))
    backend.select(tiny["base"], None)
    got.append(_greedy(backend))
    assert len(fake_vllm.LLM.instances) == 1 and backend.lora_ids == {str(tiny["lora"]): 1, str(second): 2}
    assert got == [_greedy(HFBackend(tiny["base"], a)) for a in (tiny["lora"], second, None)]
    assert got[0] != got[1]


def test_snapshots_vllm_cannot_serve_are_pushed_into_one_engine(tiny, tmp_path):
    plan = [(tiny["base"], tiny["dora"]), (tiny["base"], tiny["lora"]), (tiny["base"], None)]
    backend = VLLMBackend(tiny["base"], tiny["dora"], plan=plan, merge_dir=tmp_path / "d", api=fake_vllm.api())
    assert backend.mode == "merged" and "DoRA" in backend.merged_from
    assert backend.llm.kwargs["distributed_executor_backend"] == "external_launcher"  # load_weights in-process
    got = [_greedy(backend)]
    backend.select(tiny["base"], tiny["lora"], tmp_path / "l")
    got.append(_greedy(backend))
    backend.select(tiny["base"], None)  # the base's own weights pushed back
    got.append(_greedy(backend))
    assert len(fake_vllm.LLM.instances) == 1 and backend.pushes == 2
    assert got == [_greedy(HFBackend(tiny["base"], a)) for a in (tiny["dora"], tiny["lora"], None)]


def _second_lora(tiny, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(2)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny["base"]),
                           LoraConfig(r=12, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(4.0)
    model.save_pretrained(tmp_path / "snap")
    return tmp_path / "snap"


def _vllm_job(tiny, tmp_path, monkeypatch, **train):
    """evaluate_cell's vLLM job on the fake engine: the final adapter (tiny's lora) and the snapshot of step 5."""
    from lorarl.evaluate import engines
    from lorarl.evaluate import main as ev
    from lorarl.evaluate import vllm_backend
    from lorarl.grading.benchmarks import Problem

    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", True)
    monkeypatch.setattr(vllm_backend, "_vllm_api", fake_vllm.api)
    monkeypatch.setattr(engines, "probe_vllm", lambda *probe: (True, True, False))  # the fake engine runs "here"
    second = _second_lora(tiny, tmp_path)
    cfg = CellConfig.model_validate({"train": train, "eval": {"backend": "vllm", "benchmarks": {"synthetic": {
        "protocol": {"kind": "greedy", "temperature": 0, "n": 1, "ks": [1], "max_new_tokens": 6}}}}})
    monkeypatch.setattr(ev, "requested_targets", lambda cfg, is_base, targets=None: [("synthetic", None), ("synthetic", 5)])
    monkeypatch.setattr(ev, "weights_for", lambda cfg, res, study, cell, is_base, step:
                        (tiny["base"], tiny["lora"] if step is None else second))
    monkeypatch.setattr(ev, "load_problems", lambda name, cfg: [Problem(str(k), p, "1") for k, p in enumerate(PROMPTS)])
    monkeypatch.setattr(ev, "log_to_mlflow", lambda *a, **k: None)
    return ev, cfg


def test_an_evaluation_job_lengthens_max_model_len_to_its_longest_prompt(tiny, tmp_path, monkeypatch, capsys):
    """train.max_prompt_length 2: the plan's max_model_len (2 + 6 tokens) is shorter than the real prompts' budget:
    the job measures its prompts before the engine starts, gives vLLM the longest prompt + max_new_tokens, says so,
    and every target runs to its full budget (vLLM would otherwise refuse or cut them)."""
    from transformers import AutoTokenizer

    from lorarl.language.matrix import Cell
    from lorarl.tasks.prompt import build_prompt, prompt_ids

    ev, cfg = _vllm_job(tiny, tmp_path, monkeypatch, max_prompt_length=2)
    tok = AutoTokenizer.from_pretrained(tiny["base"])
    longest = max(len(prompt_ids(tok, build_prompt(cfg.prompt, p, tok), cfg.prompt)) for p in PROMPTS)
    assert longest + 6 > 8
    ev.evaluate_cell("s", Cell("c", {}, cfg, "h"), tmp_path / "res")
    assert fake_vllm.LLM.instances[0].kwargs["max_model_len"] == longest + 6
    assert f"more than the memory plan's 8 (lorarl.language.evalplan.lengths.sequence_tokens): vLLM's max_model_len " \
           f"{longest + 6}" in capsys.readouterr().err
    assert sorted(f.name for f in (tmp_path / "res" / "s" / "c" / "eval").glob("*.jsonl")) == \
        ["synthetic.jsonl", "synthetic@5.jsonl"]


def test_evaluation_job_builds_one_engine_for_every_snapshot(tiny, tmp_path, monkeypatch):
    """evaluate_cell with eval.backend vllm over the final adapter and a snapshot: one engine (a second would fail
    vLLM's memory check, as the fake does), each target generated from its own adapter."""
    from lorarl.language.matrix import Cell

    ev, cfg = _vllm_job(tiny, tmp_path, monkeypatch)
    ev.evaluate_cell("s", Cell("c", {}, cfg, "h"), tmp_path / "res")
    assert len(fake_vllm.LLM.instances) == 1
    llm = fake_vllm.LLM.instances[0]
    assert llm.adapter_loads == 2 and list(llm.adapters) == [2] and llm.kwargs["max_lora_rank"] == 16  # max_loras 1: LRU
    # max_model_len: the evaluation's longest sequence (the memory plan's length), not the model's whole context
    assert llm.kwargs["max_model_len"] == sequence_tokens(cfg) == 32 + 6
    out = tmp_path / "res" / "s" / "c" / "eval"
    texts = {f.name: [json.loads(line)["completion"] for line in f.read_text().splitlines()]
             for f in out.glob("*.jsonl")}
    assert sorted(texts) == ["synthetic.jsonl", "synthetic@5.jsonl"]
    assert texts["synthetic@5.jsonl"] != texts["synthetic.jsonl"]


def test_merged_pushes_on_vllms_cpu_build_use_the_layerwise_reload(tiny, tmp_path):
    """vLLM's CPU build repacks its linear layers and drops their weight_loader: model.load_weights raises there
    (tests/vllm_real checks it on the real engine); the backend pushes through model_runner.reload_weights."""
    api = fake_vllm.api(cpu=True)
    plan = [(tiny["base"], tiny["dora"]), (tiny["base"], None)]
    backend = VLLMBackend(tiny["base"], tiny["dora"], plan=plan, merge_dir=tmp_path / "d", api=api)
    runner = backend.llm.llm_engine.model_executor.driver_worker.model_runner
    with pytest.raises(AttributeError, match="weight_loader"):
        runner.model.load_weights(list(backend.llm.hf_model.named_parameters()))
    backend.select(tiny["base"], None)
    assert backend.pushes == 1 and _greedy(backend) == _greedy(HFBackend(tiny["base"]))


def test_an_evaluation_engine_on_vllms_cpu_build_gets_a_kv_cache_it_can_have_and_runs_eager(tiny, tmp_path, monkeypatch):
    """vLLM's CPU build refuses its default gpu_memory_utilization (0.92 of host memory) on a machine in use:
    the backend gives the engine VLLM_CPU_KVCACHE_SPACE=1 GiB unless the job set one; a GPU engine is left alone."""
    import os

    def build(cpu: bool) -> VLLMBackend:
        fake_vllm.LLM.instances = []  # one engine per job: each case is its own job
        return VLLMBackend(tiny["base"], None, api=fake_vllm.api(cpu=cpu))

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert "enforce_eager" not in build(cpu=False).llm_args  # a GPU engine keeps its compiled graphs
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    assert build(cpu=True).llm_args["enforce_eager"] is True  # CPU build: no inductor compile at start
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    build(cpu=True)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_a_prompt_whose_budget_passes_max_model_len_is_refused(tiny):
    """vLLM refuses a prompt longer than max_model_len and stops a request at max_model_len as if its budget were
    spent: the backend refuses a prompt + max_new_tokens over the engine's length before generating, naming the fix."""
    backend = VLLMBackend(tiny["base"], None, api=fake_vllm.api(), max_model_len=20)
    assert backend.llm.kwargs["max_model_len"] == 20
    with pytest.raises(ValueError, match=r"a prompt of \d+ tokens \+ max_new_tokens 24 exceeds the vLLM "
                                         r"engine's max_model_len 20 .*raise train.max_prompt_length"):
        backend.generate(PROMPTS[:1], Protocol.greedy(max_new_tokens=24))
    assert backend.llm.generate_calls == 0  # refused before vLLM saw it
