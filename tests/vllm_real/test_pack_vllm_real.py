"""Packed cells rolling out through vLLM's real CPU engine (lorarl.pack.vllm_rollouts): ``rollout.engine: vllm`` cells
pack, one in-process multi-LoRA engine serves every member's adapter, one ``generate`` call per step.

* Members of ranks 1, 8 and 32 (alphas 2, 4, 64; seeds, beta, lr, temperature differing) in ONE engine
  (max_lora_rank 32, the largest; max_loras 3): over 2 full steps each member's adapter, metrics and RNG streams
  equal its solo vLLM run's (a pack of one on the same engine) to 1e-6 (harness tests/support/pack_mixed_ranks.py);
  the packed step's requests for a member (prompts, n, seed, temperature, top-p, stop ids, the adapter handed
  over) are its solo run's; one generate call per step; each member's adapter handed over once per step.
* Greedy: a member's greedy samples in the pack equal its solo greedy samples and HF's greedy decoding with its
  adapter. vLLM does not promise batch invariance: where a token differs, the top two logits (HF, fp32) at that
  position are within float noise (NEAR_TIE) of each other; such positions are counted (and printed).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.vllm_real

NEAR_TIE = 1e-4  # |top-1 - top-2 logit| below this (fp32): a token that batching may flip
ROLLOUT = {"engine": "vllm", "gpu_memory_utilization": 0.15, "enforce_eager": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """tests/train/test_grpo.py's tiny model and tokenizer, at head_dim 32 (vLLM's CPU attention refuses 16)."""
    from tests.support.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny32"), hidden=64, intermediate=128)


def vllm_cells(model_dir: str, steps: int = 3) -> list:
    """tests/support/pack_mixed_ranks.py's three cells (ranks 1/8/32), rolling out through vLLM."""
    from lorarl.language.config import CellConfig
    from tests.support.pack_mixed_ranks import mixed_rank_cells

    return [SimpleNamespace(id=c.id, config=CellConfig(**{**c.config.model_dump(), "rollout": ROLLOUT}))
            for c in mixed_rank_cells(model_dir, steps=steps)]


class Spy:
    """Records the engine's generate calls (each prompt's request and adapter weights) and the adapters handed over
    (from memory or from a folder: lorarl.pack.multilora.EngineAdapters.update)."""

    def __init__(self, llm, monkeypatch):
        from lorarl.pack.multilora import AdapterState, EngineAdapters

        self.calls, self.adds, self.weights = [], [], {}
        real_generate, real_update = llm.generate, EngineAdapters.update

        def generate(prompts, params, **kw):
            loras = kw.get("lora_request")
            self.calls.append([(tuple(p["prompt_token_ids"]), q.n, q.seed, q.temperature, q.top_p, q.max_tokens,
                                tuple(q.stop_token_ids or ()), self.weights[r.lora_int_id])
                               for p, q, r in zip(prompts, params, loras)])
            return real_generate(prompts, params, **kw)

        def update(this, adapters):
            reqs = real_update(this, adapters)
            for r, a in zip(reqs, adapters):
                self.adds.append(r.lora_name)
                self.weights[r.lora_int_id] = a.tensors if isinstance(a, AdapterState) else _adapter(a)
            return reqs

        monkeypatch.setattr(llm, "generate", generate)
        monkeypatch.setattr(EngineAdapters, "update", update)


def _adapter(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "adapter_model.safetensors"))


def _same_request(a: tuple, b: tuple, tol: float) -> bool:
    wa, wb = a[-1], b[-1]
    return a[:-1] == b[:-1] and wa.keys() == wb.keys() and all(float((wa[n] - wb[n]).abs().max()) <= tol for n in wa)


def test_ranks_1_8_32_pack_equals_solo_on_one_real_engine(model_dir, tmp_path, monkeypatch):
    """Item 4 (vLLM half) and item 3: two full steps of the pack = each member's solo vLLM run to 1e-6; the same
    requests and seeds; one engine (max_lora_rank 32), one generate call per step, each adapter handed over once."""
    from lorarl.pack import vllm_rollouts
    from lorarl.pack.build import build_pack
    from tests.support.pack_mixed_ranks import assert_pack_equals_solo

    cells = vllm_cells(model_dir, steps=2)
    probe = build_pack(cells, results_dir=tmp_path, device="cpu")  # the production path builds the engine
    llm = probe.loop.rollouts.llm
    lora_cfg = llm.llm_engine.vllm_config.lora_config
    assert type(llm).__module__.startswith("vllm.") and (lora_cfg.max_lora_rank, lora_cfg.max_loras) == (32, 3)
    assert llm.llm_engine.model_config.dtype == torch.float32
    spy = Spy(llm, monkeypatch)
    assert probe.loop.rollouts.memory  # the real engine takes the adapters from memory (no file per step)
    rows = assert_pack_equals_solo(cells, tmp_path, steps=2, tol=1e-6)  # pack, then each member alone
    assert vllm_rollouts._ENGINE["llm"] is llm  # every pack and solo run on the one engine of this process
    assert len(spy.calls) == 2 + 3 * 2  # one call per step: the pack's 2, then 2 per solo run
    names = [c.id for c in cells]
    assert spy.adds == [f"{n}@{v}" for v in range(2) for n in names] + [f"{n}@{v}" for n in names for v in range(2)]
    for step in range(2):
        packed = spy.calls[step]
        assert len(packed) == 3 * 2  # 3 members x P = 2 prompts, each once with n = G = 2
        for k in range(3):
            mine = packed[2 * k:2 * k + 2]
            alone = spy.calls[2 + 2 * k + step]
            assert len(alone) == 2 and all(_same_request(a, b, 1e-6) for a, b in zip(mine, alone)), (names[k], step)
            assert all(r[1] == 2 for r in mine)
    temps = {round(r[3], 3) for r in spy.calls[0]}
    assert temps == {1.0, 0.7}  # each member samples with its own temperature
    for r in rows:  # the sampler's logprobs are the trainer's (float noise): the adapters reached the engine
        assert all(r[n]["rollout/logp_diff_max"] < 1e-4 for n in names), r


def test_ranks_1_8_32_requests_in_one_call_equal_alone(model_dir, tmp_path):
    """tests/support/pack_mixed_ranks.py's rollout-level check on the real engine: three adapters of ranks 1/8/32 in one
    generate call sample each member's tokens as alone, logprobs to 1e-6."""
    from lorarl.pack.generate import SampleSettings
    from real_engine import real_api
    from tests.support.pack_mixed_ranks import assert_multilora_pack_equals_solo, save_mixed_rank_adapters

    llm = _engine(model_dir, tmp_path)
    tok = llm.get_tokenizer()
    names, dirs = save_mixed_rank_adapters(model_dir, tmp_path / "ad")
    s = SampleSettings(prompt_width=16, max_new_tokens=8, pad_token_id=tok.pad_token_id, eos_token_ids=(tok.eos_token_id,))
    prompts = [tok("Q: 1+2=?\nA: ")["input_ids"], tok("Q: 3+4=?\nA: ")["input_ids"]]
    packed = assert_multilora_pack_equals_solo(real_api(), llm, names, dirs, prompts, s, generations=2, tol=1e-6)
    assert len({tuple(map(tuple, (t for t, _ in packed[k]))) for k in packed}) == 3  # each its own adapter


def _engine(model_dir, tmp_path):
    """The process's pack engine (built by the first test's pack; built here if this test runs alone)."""
    from lorarl.pack import vllm_rollouts
    from lorarl.pack.build import build_pack

    if not vllm_rollouts._ENGINE or vllm_rollouts._ENGINE["model"] != model_dir:
        build_pack(vllm_cells(model_dir), results_dir=tmp_path, device="cpu")
    return vllm_rollouts._ENGINE["llm"]


def _greedy(rollouts, groups):
    """Greedy samples (temperature 0, n = 1) of each member's ``groups`` through ``rollouts`` (its adapters handed
    over already): {k: [tokens per prompt]}."""
    from dataclasses import replace

    rollouts.sample = replace(rollouts.sample, temperature=0.0, max_new_tokens=16)
    gens = [torch.Generator().manual_seed(k) if g is not None else None for k, g in enumerate(groups)]
    out = rollouts(groups, gens, 1)
    return {k: o.completion_ids for k, o in enumerate(out) if o is not None}


def _saved(rollouts, k: int, path: Path) -> Path:
    """Member k's current adapter saved as evaluation loads it (the folder the disk path would hand over)."""
    return rollouts.save[k](path, rollouts.models[k])


def _hf_model(model_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                     str(adapter_dir)).eval()


def _near_tie(model, prompt, a, b) -> int:
    """0 when ``a == b``; else 1 after checking that at their first differing position the model's top two logits
    are within NEAR_TIE (a tie that batching may break either way)."""
    if a == b:
        return 0
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(a[:j])])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    assert float(top[0] - top[1]) < NEAR_TIE, (j, a, b, top.tolist())
    return 1


def test_greedy_members_in_the_pack_equal_their_solo_and_hf_greedy(model_dir, tmp_path, capsys):
    """Item 2c: each member's prompts go to its own adapter (its greedy tokens are HF's greedy decoding with that
    adapter, and the members' differ); in the pack they equal its greedy tokens alone, up to counted near-ties."""
    from lorarl.pack.build import build_pack

    llm = _engine(model_dir, tmp_path)
    cells = vllm_cells(model_dir)
    pack = build_pack(cells, results_dir=tmp_path / "p", device="cpu", llm=llm)
    with torch.no_grad():  # trained adapters: B off zero, each member its own
        for k, c in enumerate(pack.loop.trainer.cells):
            g = torch.Generator().manual_seed(10 + k)
            for n, p in c.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    tok = pack.tokenizer
    prompts = [tok(f"Q: {a}+{b}=?\nA: ")["input_ids"] for a, b in ((1, 2), (12, 7), (45, 9), (3, 30), (8, 8), (90, 4))]
    pack.loop.rollouts.handover()
    packed = _greedy(pack.loop.rollouts, [prompts] * 3)
    assert pack.loop.rollouts.handovers == 1 and pack.loop.rollouts.calls == 1
    ties = {"solo": 0, "hf": 0}
    for k, c in enumerate(cells):
        model = _hf_model(model_dir, _saved(pack.loop.rollouts, k, tmp_path / "hf" / c.id))
        solo = build_pack([c], results_dir=tmp_path / c.id, device="cpu", llm=llm)
        with torch.no_grad():
            for p, q in zip(solo.loop.trainer.cells[0].model.parameters(), pack.loop.trainer.cells[k].model.parameters()):
                p.copy_(q)
        solo.loop.rollouts.handover()
        alone = _greedy(solo.loop.rollouts, [prompts])[0]
        for prompt, a, b in zip(prompts, packed[k], alone):
            ties["solo"] += _near_tie(model, prompt, a, b)
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
            ties["hf"] += _near_tie(model, prompt, a, hf)
    assert packed[0] != packed[1] != packed[2] != packed[0]  # each member sampled with its own adapter
    swapped = list(packed[0][0])
    swapped[0] = (swapped[0] + 1) % len(tok)  # a real difference (no tie) is not counted as one
    with pytest.raises(AssertionError):
        _near_tie(_hf_model(model_dir, _saved(pack.loop.rollouts, 0, tmp_path / "hf0")), prompts[0], packed[0][0],
                  swapped)
    print(f"near-ties: pack vs solo {ties['solo']}, vLLM vs HF {ties['hf']} of {3 * len(prompts)} rows")
    assert ties["solo"] <= len(prompts) and ties["hf"] <= len(prompts)


def test_a_two_rank_pack_job_runs_an_engine_per_rank(model_dir, tmp_path):
    """A 2-member vLLM pack as a 2-task job: each rank a one-process pack with its own engine (its process is a
    one-process job for vLLM's in-process launcher); every member's outputs equal the one-task pack's."""
    from tests.support.pack_job_ranks import _study, assert_two_rank_pack_equals_one

    logs = assert_two_rank_pack_equals_one(_study(tmp_path, model_dir, kls=(0.0, 0.05), rollout=ROLLOUT), tmp_path)
    text = "".join(p.read_text() for p in logs.glob("*_log.out")) + "".join(p.read_text() for p in logs.glob("*_log.err"))
    assert text.count("[lorarl] pack: vLLM engine for") == 2, text[-3000:]  # one engine per rank, 1 adapter each
    assert text.count("(max_loras 1, max_lora_rank") == 2


def test_memory_handover_samples_the_disk_paths_tokens_and_a_failed_load_keeps_the_old(model_dir, tmp_path,
                                                                                       monkeypatch):
    """Item 3 of issue 49: the adapters handed over from memory (lorarl.pack.lora_memory) sample the same greedy
    token ids as the same adapters through disk; a load that fails while staging (a rank above the engine's) or
    while committing (a tensor of the wrong shape, after two members went in) leaves the engine with the previous
    step's adapters, which still sample the same tokens."""
    from lorarl.pack.build import build_pack

    llm = _engine(model_dir, tmp_path)
    pack = build_pack(vllm_cells(model_dir), results_dir=tmp_path / "m", device="cpu", llm=llm)
    r = pack.loop.rollouts
    with torch.no_grad():  # trained adapters: B off zero, each member its own
        for k, c in enumerate(pack.loop.trainer.cells):
            g = torch.Generator().manual_seed(20 + k)
            for n, p in c.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    tok = pack.tokenizer
    prompts = [tok(f"Q: {a}+{b}=?\nA: ")["input_ids"] for a, b in ((1, 2), (12, 7), (45, 9))]
    assert r.memory
    r.handover()
    assert all(q.lora_path.startswith("memory://") for q in r.adapters.requests)
    memory = _greedy(r, [prompts] * 3)
    r.memory = False
    r.handover()
    assert all(Path(q.lora_path).is_dir() for q in r.adapters.requests)
    assert _greedy(r, [prompts] * 3) == memory
    r.memory = True
    r.handover()
    old, held = r.adapters.requests, llm.llm_engine.list_loras()
    assert _greedy(r, [prompts] * 3) == memory and held == {q.lora_int_id for q in old}
    from vllm.lora.model_manager import LRUCacheLoRAModelManager

    adds, add = [], LRUCacheLoRAModelManager.add_adapter
    monkeypatch.setattr(LRUCacheLoRAModelManager, "add_adapter", lambda self, lora: adds.append(lora.id) or add(self, lora))
    state = r.states[2]
    for broken, match, added in ((lambda t, c: (t, {**c, "r": 64}), "greater than max_lora_rank", 0),  # staging
                                 (lambda t, c: ({k: (v.T.contiguous() if "lora_A" in k else v) for k, v in t.items()},
                                                c), None, 3)):  # committing: the slot copy, members 0 and 1 in
        monkeypatch.setattr(r, "states", [*r.states[:2], lambda m, out=None, broken=broken: broken(*state(m))])
        adds.clear()
        with pytest.raises(Exception, match=match):
            r.handover()
        assert len(adds) == added and r.adapters.requests is old and llm.llm_engine.list_loras() == held
        assert _greedy(r, [prompts] * 3) == memory
    monkeypatch.setattr(r, "states", [*r.states[:2], state])
    r.handover()  # and the next load goes through, under ids never used before
    assert min(q.lora_int_id for q in r.adapters.requests) > max(held) + 6
