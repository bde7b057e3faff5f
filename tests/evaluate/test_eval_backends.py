"""Generation backends on a tiny random Qwen2 model: HF end to end (LoRA merged vs unmerged),
vLLM request building against a recording fake (vllm is never imported)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from lorarl.evaluate.backends import (Completion, HFBackend, completions_from_ids,  # noqa: E402
                                      format_prompt, length_batches, merge_adapter, padding_tokens)
from lorarl.grading.protocols import Protocol  # noqa: E402
from lorarl.evaluate.vllm_backend import VLLMBackend, lora_servable, request_seed, sampling_kwargs  # noqa: E402
from tests.support.eval_backends import PROMPTS, _tokenizer  # noqa: E402


GREEDY = Protocol.greedy(max_new_tokens=12)


def test_lora_merged_and_unmerged_give_identical_greedy_output(tiny):
    base = HFBackend(tiny["base"], batch_size=2)
    unmerged = HFBackend(tiny["base"], tiny["lora"], merge=False, batch_size=2)
    merged = HFBackend(tiny["base"], tiny["lora"], merge=True, batch_size=2)
    out_u = unmerged.generate(PROMPTS, GREEDY)
    out_m = merged.generate(PROMPTS, GREEDY)
    assert out_u == out_m
    assert all(len(c) == 1 and isinstance(c[0], Completion) for c in out_u)
    for (c,) in out_u:
        assert 1 <= c.n_tokens <= 12
        assert not c.truncated or c.n_tokens == 12
    # the adapter matters: logits move, and so (for this seed) does the greedy text
    enc = base.tokenizer(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        diff = (base.model(**enc).logits - unmerged.model(**enc).logits).abs().max().item()
    assert diff > 1e-2
    assert base.generate(PROMPTS, GREEDY) != out_u


def test_batching_does_not_change_greedy_output(tiny):
    one = HFBackend(tiny["base"], tiny["lora"], batch_size=1).generate(PROMPTS, GREEDY)
    many = HFBackend(tiny["base"], tiny["lora"], batch_size=8).generate(PROMPTS, GREEDY)
    assert one == many


SHUFFLED = ["Q: 1=?\nA: ", "Q: 45+45-9+120-3=?\nA: ", "Q: 3-1=?\nA: ", "Q: 12+7+100-5=?\nA: ",
            "Q: 2=?\nA: ", "Q: 45+45-9+120-3+7=?\nA: "]  # lengths short, long, mid, long, short, long


def test_length_batches_put_similar_lengths_together_and_pad_less():
    lengths = [3, 9, 5, 8, 3, 10]
    assert length_batches(lengths, 1, 2) == [[(5, 0), (1, 0)], [(3, 0), (2, 0)], [(0, 0), (4, 0)]]
    assert length_batches(lengths, 2, 3, by_length=False)[0] == [(0, 0), (0, 1), (1, 0)]  # prompt order
    assert padding_tokens(lengths, length_batches(lengths, 1, 2)) == [1, 3, 0]
    assert padding_tokens(lengths, length_batches(lengths, 1, 2, by_length=False)) == [6, 3, 7]


def test_length_bucketed_batches_give_the_same_greedy_completions_in_prompt_order_with_less_padding(tiny):
    backend = HFBackend(tiny["base"], tiny["lora"], merge=True, batch_size=2)
    bucketed = backend.generate(SHUFFLED, GREEDY)
    bucketed_pad = backend.last_padding
    backend.by_length = False
    in_order = backend.generate(SHUFFLED, GREEDY)
    order_pad = backend.last_padding
    backend.batch_size = 1
    alone = backend.generate(SHUFFLED, GREEDY)  # one prompt per call: no padding at all
    assert bucketed == in_order == alone and len(bucketed) == len(SHUFFLED)
    assert len({c[0].text for c in bucketed}) > 1  # the prompts get different completions: the order is checked
    assert backend.last_padding == [0] * len(SHUFFLED)
    assert len(bucketed_pad) == len(order_pad) == 3 and sum(bucketed_pad) < sum(order_pad) / 2


def test_sampling_shapes_and_seed(tiny):
    backend = HFBackend(tiny["base"], tiny["lora"], merge=True, batch_size=4)
    proto = Protocol.sampling(3, temperature=1.0, top_p=0.95, max_new_tokens=6)
    a = backend.generate(PROMPTS, proto, seed=7)
    b = backend.generate(PROMPTS, proto, seed=7)
    c = backend.generate(PROMPTS, proto, seed=8)
    assert a == b and a != c
    assert [len(x) for x in a] == [3, 3, 3]
    assert all(1 <= s.n_tokens <= 6 for x in a for s in x)
    assert len({s.text for x in a for s in x}) > 1


def test_generation_config_ignores_model_defaults(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny["base"])
    model.generation_config.top_k = 5
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.do_sample = True
    model.save_pretrained(tmp_path / "m")
    AutoTokenizer.from_pretrained(tiny["base"]).save_pretrained(tmp_path / "m")
    backend = HFBackend(tmp_path / "m")
    gc = backend.model.generation_config
    assert (gc.top_k, gc.repetition_penalty, gc.do_sample) == (None, None, None)
    assert gc.eos_token_id == backend.tokenizer.eos_token_id
    cfg = backend._generation_config(Protocol.sampling(2, max_new_tokens=4))
    assert (cfg.top_k, cfg.repetition_penalty, cfg.temperature, cfg.top_p) == (0, 1.0, 0.6, 0.95)
    assert backend._generation_config(GREEDY).do_sample is False
    assert backend.generate(PROMPTS, GREEDY) == HFBackend(tiny["base"]).generate(PROMPTS, GREEDY)


def test_merge_adapter_dir_matches_unmerged(tiny, tmp_path):
    out = merge_adapter(tiny["base"], tiny["lora"], tmp_path / "merged")
    assert (out / "config.json").exists() and not (out / "adapter_config.json").exists()
    assert (HFBackend(out).generate(PROMPTS, GREEDY)
            == HFBackend(tiny["base"], tiny["lora"]).generate(PROMPTS, GREEDY))


def test_completions_from_ids():
    tok = _tokenizer()
    eos = tok.eos_token_id
    ids = lambda s: tok(s)["input_ids"]  # noqa: E731
    rows = [ids("12") + [eos, tok.pad_token_id, tok.pad_token_id], ids("345"), [eos]]
    out = completions_from_ids(rows, tok, [eos])
    assert out == [Completion("12", 3, False), Completion("345", 3, True), Completion("", 1, False)]


def test_format_prompt_chat_template():
    tok = _tokenizer()
    assert format_prompt(tok, "hi", None) == ("hi", False)
    with pytest.raises(ValueError):
        format_prompt(tok, "hi", True)
    tok.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
    assert format_prompt(tok, "hi", None) == ("<hi>A: ", True)
    assert format_prompt(tok, "hi", False) == ("hi", False)


# ----------------------------------------------------------------------------- vLLM (fake)
class _Recorder:
    def __init__(self):
        self.calls = []

    def cls(self, name):
        rec = self

        class Made(SimpleNamespace):
            def __init__(self, **kw):
                super().__init__(**kw)
                rec.calls.append((name, kw))
        Made.__name__ = name
        return Made


def _fake_api():
    rec = _Recorder()

    class FakeLLM:
        def __init__(self, **kw):
            rec.calls.append(("LLM", kw))
            # vLLM's context: max_model_len, else the model's (the tiny model's max_position_embeddings 128)
            self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=kw.get("max_model_len") or 128))

        def get_tokenizer(self):
            return _tokenizer()

        def generate(self, prompts, params, use_tqdm=True, lora_request=None):
            rec.calls.append(("generate", dict(prompts=list(prompts), params=params,
                                               lora_request=lora_request)))
            outs = []
            for p, sp in zip(prompts, params if isinstance(params, list) else [params] * len(prompts)):
                outs.append(SimpleNamespace(outputs=[
                    SimpleNamespace(text=f"\\boxed{{{j}}}", token_ids=[1] * (j + 2),
                                    finish_reason="length" if j == 1 else "stop")
                    for j in range(sp.n)]))
            return outs

    api = SimpleNamespace(LLM=FakeLLM, SamplingParams=rec.cls("SamplingParams"),
                          LoRARequest=rec.cls("LoRARequest"))
    return api, rec


def test_vllm_lora_request(tiny):
    api, rec = _fake_api()
    backend = VLLMBackend(tiny["base"], tiny["lora"], api=api, seed=3, max_model_len=4096)
    llm_kw = dict(rec.calls)["LLM"]
    assert llm_kw["model"] == str(tiny["base"])
    assert (llm_kw["enable_lora"], llm_kw["max_lora_rank"], llm_kw["max_model_len"]) == (True, 8, 4096)
    assert dict(rec.calls)["LoRARequest"] == dict(lora_name="lora", lora_int_id=1,
                                                  lora_path=str(tiny["lora"]))
    out = backend.generate(PROMPTS, Protocol.sampling(4, max_new_tokens=100), seed=42)
    name, gen = rec.calls[-1]
    assert name == "generate" and gen["lora_request"] is backend.lora_request
    tok = _tokenizer()  # no chat template: the plain text's ids, exactly as the train stage makes them
    assert gen["prompts"] == [{"prompt_token_ids": tok(text=[p])["input_ids"][0]} for p in PROMPTS]
    params = [kw for name, kw in rec.calls if name == "SamplingParams"]  # one request per problem, its own seed
    assert params == [dict(n=4, temperature=0.6, top_p=0.95, top_k=0, max_tokens=100, seed=request_seed(42, k, 4))
                      for k in range(len(PROMPTS))]
    assert len({request_seed(42, k, 4) + j for k in range(len(PROMPTS)) for j in range(4)}) == 12  # disjoint streams
    assert [len(x) for x in out] == [4, 4, 4]
    assert out[0][1] == Completion("\\boxed{1}", 3, True)
    assert out[0][0] == Completion("\\boxed{0}", 2, False)


def test_vllm_greedy_params_and_no_adapter(tiny):
    api, rec = _fake_api()
    backend = VLLMBackend(tiny["base"], api=api)
    assert "enable_lora" not in dict(rec.calls)["LLM"] and backend.lora_request is None
    backend.generate(PROMPTS[:1], GREEDY, seed=0)
    assert sampling_kwargs(GREEDY, 0) == dict(n=1, temperature=0.0, top_p=1.0, top_k=0,
                                              max_tokens=12, seed=0)


def test_vllm_merges_dora_first(tiny, tmp_path):
    assert lora_servable(tiny["lora"]) == (True, "")
    assert lora_servable(tiny["dora"])[0] is False
    api, rec = _fake_api()
    backend = VLLMBackend(tiny["base"], tiny["dora"], merge_dir=tmp_path / "m", api=api)
    llm_kw = dict(rec.calls)["LLM"]
    assert llm_kw["model"] == str(tmp_path / "m") and "enable_lora" not in llm_kw
    assert backend.lora_request is None and "DoRA" in backend.merged_from
    assert not any(name == "LoRARequest" for name, _ in rec.calls)
    # the merged DoRA model generates what the unmerged peft model does
    assert (HFBackend(tmp_path / "m").generate(PROMPTS, GREEDY)
            == HFBackend(tiny["base"], tiny["dora"]).generate(PROMPTS, GREEDY))


def test_vllm_rank_too_large_is_merged(tiny, tmp_path):
    cfg_path = tmp_path / "big" / "adapter_config.json"
    cfg_path.parent.mkdir()
    cfg = json.loads((tiny["lora"] / "adapter_config.json").read_text())
    cfg_path.write_text(json.dumps(dict(cfg, r=1024)))
    assert lora_servable(cfg_path.parent)[0] is False


def test_vllm_not_imported():
    assert "vllm" not in sys.modules


# ----------------------------------------------------------------------------- records
from lorarl.evaluate import records  # noqa: E402
from lorarl.grading.benchmarks import get_benchmark  # noqa: E402


class _ScriptedBackend:
    """Returns canned completions (cycled) so grading and records can be checked exactly."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, protocol, seed=0):
        k = 0
        out = []
        for _ in prompts:
            row = []
            for _ in range(protocol.n):
                t = self.texts[k % len(self.texts)]
                row.append(Completion(t, len(t), t.endswith("...")))
                k += 1
            out.append(row)
        return out


def _math_rows(n):
    return [{"problem": f"Compute {i}+1.", "answer": str(i + 1), "unique_id": f"t/{i}.json"}
            for i in range(n)]


def test_records_written_and_rescore_reproduces_summary(tmp_path):
    b = get_benchmark("math500")
    problems = b.load(rows=_math_rows(5))
    texts = ["\\boxed{1}", "\\boxed{2}", "no answer...", "\\boxed{\\frac{6}{2}}", "\\boxed{4}",
             "\\boxed{9^{9^{9^{9^{9}}}}}", "\\boxed{5}"]
    summary = records.run_benchmark(_ScriptedBackend(texts), b, problems, tmp_path, step=20,
                                    timeout_s=1.0, meta={"cell": "lora-r8"})
    jsonl = tmp_path / "math500@20.jsonl"
    assert jsonl.exists() and (tmp_path / "math500@20.json").exists()
    assert not list(tmp_path.glob(".*tmp"))                           # no temporary files left
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert len(lines) == 5 * 4
    assert set(lines[0]) == {"problem_id", "sample", "prompt", "gold", "completion", "extracted",
                             "correct", "timed_out", "truncated", "n_tokens"}
    assert lines[2]["extracted"] is None and lines[2]["truncated"] is True
    assert any(x["timed_out"] for x in lines)
    stored = json.loads((tmp_path / "math500@20.json").read_text())
    assert stored == json.loads(json.dumps(summary))
    assert stored["metrics"]["avg@4"]["n_problems"] == 5 and stored["meta"]["cell"] == "lora-r8"
    assert set(stored["metrics"]) == {"avg@4", "pass@4"}
    # exact reproduction, without generating
    assert records.rescore(jsonl) == stored
    # a changed completion changes the re-scored numbers (and write=True persists them)
    edited = [dict(x, completion="\\boxed{" + x["gold"] + "}") for x in lines]
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in edited))
    new = records.rescore(jsonl, write=True)
    assert new["metrics"]["avg@4"]["value"] == 1.0
    assert json.loads((tmp_path / "math500@20.json").read_text()) == new
    assert all(s.correct for s in records.read_samples(jsonl))


def test_metrics_match_protocol_arithmetic(tmp_path):
    from lorarl.grading.protocols import Protocol, mean_pass_at_k

    b = get_benchmark("math500")
    problems = b.load(rows=_math_rows(3))
    proto = Protocol.sampling(4, ks=(1, 2, 4), max_new_tokens=8)
    texts = ["\\boxed{1}", "x", "x", "x", "\\boxed{2}", "\\boxed{2}", "x", "x", "x", "x", "x", "x"]
    s = records.run_benchmark(_ScriptedBackend(texts), b, problems, tmp_path, protocol=proto)
    matrix = [[True, False, False, False], [True, True, False, False], [False] * 4]
    for k in (1, 2, 4):
        assert s["metrics"][f"pass@{k}"]["value"] == pytest.approx(mean_pass_at_k(matrix, k))
    assert s["metrics"]["avg@4"]["value"] == pytest.approx(3 / 12)
    assert (tmp_path / "math500.jsonl").exists()                      # no step: bare name


def test_choice_records_rescore(tmp_path):
    b = get_benchmark("gpqa")
    rows = [dict(b.example, **{"Record ID": f"r{i}", "Question": f"Q{i}?"}) for i in range(6)]
    problems = b.load(rows=rows)
    texts = [f"The answer is ({p.gold})" if i % 2 == 0 else "\\boxed{Z}"
             for i, p in enumerate(problems)]
    s = records.run_benchmark(_ScriptedBackend(texts), b, problems, tmp_path)
    assert s["metrics"]["pass@1"]["value"] == 0.5 and s["grader"] == "choice"
    assert records.rescore(tmp_path / "gpqa.jsonl") == s


def test_hf_backend_end_to_end_records(tiny, tmp_path):
    b = get_benchmark("synthetic")
    problems = b.load(rows=[{"id": f"eval-{i}", "prompt": p, "answer": "19"}
                            for i, p in enumerate(PROMPTS)])
    backend = HFBackend(tiny["base"], tiny["lora"], merge=True)
    s = records.run_benchmark(backend, b, problems, tmp_path, protocol=GREEDY, step=0)
    assert s["n_problems"] == 3 and s["n_samples"] == 3
    assert records.rescore(tmp_path / "synthetic@0.jsonl") == s


def test_aggregate_seeds():
    sums = [{"metrics": {"pass@1": {"value": v}}} for v in (0.5, 0.7, 0.6)]
    agg = records.aggregate_seeds(sums)["pass@1"]
    assert agg["mean"] == pytest.approx(0.6) and agg["sd"] == pytest.approx(0.1)
    assert agg["n_seeds"] == 3


def test_evaluate_package_import_is_light():
    import subprocess

    code = ("import sys, lorarl.evaluate; "
            "bad = [m for m in ('torch', 'transformers', 'vllm', 'peft', 'math_verify') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
