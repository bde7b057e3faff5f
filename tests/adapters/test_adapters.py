"""lorarl.adapters: init math, the step-0 reference invariant for every method x init, the fingerprint,
optimiser/mask invariants, the SVD cache and saving (registry, config validation and the studies:
tests/adapters/test_adapter_registry.py).

Issue 5 invariants: (1) step-0 logits = the ORIGINAL base's (KL = 0) for every method x init, and
"adapter disabled" is not that reference for residual inits; (2) fingerprint fails on mismatch;
(3) init geometry; (4) LoRA+ two learning rates, LoRA-FA A frozen, masked weights frozen;
(5) one table of cases builds and takes a forward/backward/optimiser step.
All on a 2-layer Qwen2 with hidden 64 (float32, CPU).
"""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lorarl.adapters import INITS, MASKS, METHODS, AdapterMismatch, build_adapter
from lorarl.adapters import inits as I
from lorarl.adapters.fingerprint import observe
from lorarl.adapters.names import RESIDUAL_INITS
from lorarl.adapters.catalog import check_config, get_method
from lorarl.language.config import AdapterConfig, CellConfig, TrainConfig

REPO = Path(__file__).resolve().parents[2]
LORA_FAMILY = ("lora", "dora", "rslora", "lora_plus", "lora_fa")
OTHERS = ("adalora", "miss", "vera", "ia3", "ln_tuning", "full")
CASES = ([(m, {"init": i}) for m in LORA_FAMILY for i in INITS]
         + [(m, {}) for m in OTHERS]
         + [("full", {"mask": k}) for k in MASKS])
SMALL_RANK = {"miss": 8, "vera": 8}  # MiSS needs r | in/out features; VeRA's default 256 is large here

warnings.filterwarnings("ignore", message=".*")  # peft warns about init_lora_weights=False etc.
torch.set_num_threads(1)


def tiny_model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def base():
    return tiny_model()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))


def cell(method: str, lr: float = 1e-3, weight_decay: float = 0.0, steps: int = 4, seed: int = 0, **adapter):
    if method in SMALL_RANK and "rank" not in adapter:
        adapter["rank"] = SMALL_RANK[method]
    return CellConfig(seed=seed, adapter=AdapterConfig(method=method, **adapter),
                      train=TrainConfig(lr=lr, weight_decay=weight_decay, steps=steps))


def kl_per_token(p_logits, q_logits) -> float:
    lp, lq = p_logits.log_softmax(-1).double(), q_logits.log_softmax(-1).double()
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def train_step(policy, ids, global_step: int = 0):
    """What the HF trainer does per optimiser step: backward, clip, callbacks, step, zero_grad."""
    model = policy.model
    model.train()
    opt = policy.optimizer or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    policy.optimizer = opt
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    state = SimpleNamespace(global_step=global_step)
    for cb in policy.callbacks:
        cb.on_pre_optimizer_step(None, state, None, model=model)
    opt.step()
    for cb in policy.callbacks:
        cb.on_optimizer_step(None, state, None, model=model)
    opt.zero_grad()
    model.eval()
    return float(loss.detach())


# invariant 3 (init geometry, pure math): tests/adapters/test_adapter_inits.py


@pytest.mark.parametrize("alpha", [6, 12, 3])
def test_pissa_equals_peft_pissa_up_to_sign(base, alpha):
    """lorarl's `pissa` and peft's `init_lora_weights="pissa"` build the same adapter and residual at
    every scale s = alpha/r (same SVD; each singular pair may flip sign)."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    r = 6
    ours = build_adapter(copy.deepcopy(base), cell("lora", init="pissa", rank=r, alpha=alpha)).model
    peft = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear",
                                                         init_lora_weights="pissa", task_type="CAUSAL_LM"))
    layers = {n: m for n, m in peft.named_modules() if isinstance(m, LoraLayer)}
    W0s = dict(base.named_parameters())
    checked = 0
    for name, lo in ours.named_modules():
        if not isinstance(lo, LoraLayer):
            continue
        lp = layers[name]
        assert lo.scaling["default"] == lp.scaling["default"] == alpha / r
        Bo, Ao = lo.lora_B["default"].weight.detach(), lo.lora_A["default"].weight.detach()
        Bp, Ap = lp.lora_B["default"].weight.detach(), lp.lora_A["default"].weight.detach()
        sign = torch.sign((Bo * Bp).sum(0))  # per singular pair
        assert torch.allclose(Bo * sign, Bp, atol=1e-5) and torch.allclose(Ao * sign[:, None], Ap, atol=1e-5)
        assert torch.allclose(lo.get_base_layer().weight, lp.get_base_layer().weight, atol=1e-5)
        W0 = W0s[name.removeprefix("base_model.model.") + ".weight"].detach()
        U, S, Vh = torch.linalg.svd(W0, full_matrices=False)  # the adapter starts as W0's top-r part
        assert torch.allclose(lo.scaling["default"] * Bo @ Ao, (U[:, :r] * S[:r]) @ Vh[:r], atol=1e-5)
        checked += 1
    assert checked == len(layers) > 0


# ---------------------------------------------------------------------------------------------
# invariants 1 and 5: every method x init
# ---------------------------------------------------------------------------------------------


def _case_id(c):
    return f"{c[0]}-{'-'.join(map(str, c[1].values())) or 'default'}"


@pytest.mark.parametrize("method,extra", CASES, ids=[_case_id(c) for c in CASES])
def test_step0_policy_is_the_original_base_then_one_step(base, ids, method, extra):
    original = copy.deepcopy(base)  # the reference: a frozen copy of the base taken before the adapter
    with torch.no_grad():
        ref_logits = original(ids).logits
    policy = build_adapter(copy.deepcopy(base), cell(method, **extra))
    with torch.no_grad():
        logits = policy.model(ids).logits
    assert float((logits - ref_logits).abs().max()) < 1e-4
    assert abs(kl_per_token(logits, ref_logits)) < 1e-7
    fp = policy.fingerprint
    assert 0 < fp["params_trainable"] <= fp["params_total"] and fp["method"] == method
    assert len(fp["init_checksum"]) == 32
    # invariant 5: one forward/backward/optimiser step moves something and stays finite
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    loss = train_step(policy, ids)
    assert math.isfinite(loss)
    moved = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved, "one optimiser step changed no trainable parameter"
    with torch.no_grad():
        assert torch.isfinite(policy.model(ids).logits).all()


@pytest.mark.parametrize("init", RESIDUAL_INITS)
def test_adapter_disabled_is_not_the_reference_for_residual_inits(base, ids, init):
    """What TRL does for PEFT models (reference = adapter disabled) is wrong after a residual init."""
    with torch.no_grad():
        ref_logits = base(ids).logits
    policy = build_adapter(copy.deepcopy(base), cell("lora", init=init, rank=16), keep_reference=True)
    with torch.no_grad(), policy.model.disable_adapter():
        disabled = policy.model(ids).logits
        kept = policy.reference(ids).logits
    assert kl_per_token(disabled, ref_logits) > 1e-3
    assert torch.equal(kept, ref_logits)


# ---------------------------------------------------------------------------------------------
# invariant 2: fingerprint
# ---------------------------------------------------------------------------------------------


def test_plain_lora_is_rejected_under_every_other_name(base):
    plain = build_adapter(copy.deepcopy(base), cell("lora"))
    obs = observe(plain.model)
    obs["optimizer"] = plain.fingerprint["optimizer"]
    assert get_method("lora").expect(obs, check_config({"method": "lora"})) == []
    for name in METHODS:
        if name == "lora":
            continue
        extra = {"rank": 8} if name in SMALL_RANK else {}
        problems = get_method(name).expect(obs, check_config({"method": name, **extra}))
        assert problems, f"a plain LoRA model passed as {name!r}"
    dora = get_method("dora").expect(obs, check_config({"method": "dora"}))
    assert any("magnitude" in p for p in dora)


@pytest.mark.parametrize("built,claimed", [("kaiming", "gaussian"), ("gaussian", "kaiming"), ("gaussian", "rlpo"),
                                           ("rlpo", "pissa"), ("pissa", "olora"), ("olora", "rlpo"),
                                           ("dct", "kaiming")])
def test_init_mismatch_is_detected(base, built, claimed):
    policy = build_adapter(copy.deepcopy(base), cell("lora", init=built))
    obs = observe(policy.model)
    assert get_method("lora").expect(obs, check_config({"method": "lora", "init": claimed}))


def test_build_fails_loudly_when_a_builder_lies(base, monkeypatch):
    from lorarl.adapters.methods.dora import Dora

    plain = get_method("lora")
    monkeypatch.setattr(Dora, "build", lambda self, model, a, ctx: plain.build(model, a, ctx))  # plain LoRA
    with pytest.raises(AdapterMismatch, match="magnitude"):
        build_adapter(copy.deepcopy(base), cell("dora"))


def test_verify_detects_changes_after_build(base):
    policy = build_adapter(copy.deepcopy(base), cell("lora", init="rlpo"))
    counts = policy.verify()
    assert counts["params_trainable"] == policy.fingerprint["params_trainable"]
    layer = next(m for n, m in policy.model.named_modules() if n.endswith("q_proj") and hasattr(m, "lora_A"))
    with torch.no_grad():
        layer.lora_A["default"].weight.mul_(2)
    with pytest.raises(AdapterMismatch, match="checksum"):
        policy.verify()


def test_fingerprint_records_applied_config(base):
    fp = build_adapter(copy.deepcopy(base), cell("rslora", init="pissa", rank=4, alpha=8)).fingerprint
    assert fp["peft_type"] == "LORA" and fp["peft_config"]["use_rslora"] is True and fp["peft_config"]["r"] == 4
    assert fp["structure"]["lora_scalings"] == [round(8 / math.sqrt(4), 8)]
    assert fp["applied"] == {"method": "rslora", "rank": 4, "alpha": 8.0, "dropout": 0.0,
                             "target_modules": "all-linear", "init": "pissa"}
    assert fp["residual_layers"] == 14 and fp["structure"]["lora_layers"] == 14
    vera = build_adapter(copy.deepcopy(base), cell("vera")).fingerprint
    assert vera["peft_type"] == "VERA" and vera["trainable_fraction"] < 0.05


# ---------------------------------------------------------------------------------------------
# invariant 4: optimisers and masks really do what they say
# ---------------------------------------------------------------------------------------------


def _lora_params(model, kind):
    return {n: p for n, p in model.named_parameters() if f"{kind}.default" in n}


def test_lora_plus_uses_two_learning_rates(base, ids):
    lr, ratio = 1e-3, 16.0
    policy = build_adapter(copy.deepcopy(base), cell("lora_plus", lr=lr, lr_ratio=ratio))
    groups = {g["lr"] for g in policy.optimizer.param_groups if g["params"]}
    assert groups == {lr, lr * ratio}
    A0 = {n: p.detach().clone() for n, p in _lora_params(policy.model, "lora_A").items()}
    B0 = {n: p.detach().clone() for n, p in _lora_params(policy.model, "lora_B").items()}
    train_step(policy, ids)  # step 1: B0 = 0 so only B gets a gradient; Adam's first step is ~lr per entry
    dB = max(float((p.detach() - B0[n]).abs().max()) for n, p in _lora_params(policy.model, "lora_B").items())
    assert 0.5 * ratio * lr < dB <= 1.001 * ratio * lr
    A1 = {n: p.detach().clone() for n, p in _lora_params(policy.model, "lora_A").items()}
    assert all(torch.equal(A1[n], A0[n]) for n in A0)
    train_step(policy, ids, 1)
    dA = max(float((p.detach() - A1[n]).abs().max()) for n, p in _lora_params(policy.model, "lora_A").items())
    assert 0 < dA <= 1.001 * lr * math.sqrt(2)  # A moves at lr, not at ratio x lr


def test_lora_fa_leaves_A_unchanged(base, ids):
    policy = build_adapter(copy.deepcopy(base), cell("lora_fa", init="gaussian"))
    A = _lora_params(policy.model, "lora_A")
    assert A and not any(p.requires_grad for p in A.values())
    A0 = {n: p.detach().clone() for n, p in A.items()}
    B0 = {n: p.detach().clone() for n, p in _lora_params(policy.model, "lora_B").items()}
    for step in range(3):
        train_step(policy, ids, step)
    assert all(torch.equal(p, A0[n]) for n, p in _lora_params(policy.model, "lora_A").items())
    assert any(not torch.equal(p, B0[n]) for n, p in _lora_params(policy.model, "lora_B").items())


@pytest.mark.parametrize("mask", MASKS)
def test_masked_weights_never_move(base, ids, mask):
    policy = build_adapter(copy.deepcopy(base), cell("full", mask=mask, weight_decay=0.1))
    masks = policy.ctx.masks
    assert len(masks) == 14  # 7 linear layers x 2 blocks, lm_head excluded
    before = {name: p.detach().clone() for name, (p, _) in masks.items()}
    emb0 = policy.model.model.embed_tokens.weight.detach().clone()
    for step in range(2):
        train_step(policy, ids, step)
    moved_in = 0
    for name, (p, m) in masks.items():
        assert torch.equal(p[~m], before[name][~m]), f"{name}: a frozen entry moved"
        moved_in += int((p[m] != before[name][m]).sum())
    assert moved_in > 0.5 * sum(int(m.sum()) for _, m in masks.values())
    assert not torch.equal(policy.model.model.embed_tokens.weight, emb0)  # non-target weights train densely
    density = policy.fingerprint["structure"]["masks"]["density"]
    if mask in ("principal", "nonprincipal", "low_magnitude"):
        assert abs(density - 0.5) < 1e-3
    else:
        assert 0.5 < density < 1.0


def test_mask_definitions(base):
    from lorarl.adapters import masks as M

    W = base.model.layers[0].mlp.down_proj.weight.detach()
    spec = I.spectrum_of(W, 64)
    g = I.seeded_generator(0, "x")
    princ = M.make_mask("principal", W, alpha=0.3, k=4, spectrum=spec, gen=g)
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    recon = ((U[:, :4] * S[:4]) @ Vh[:4]).abs()
    assert float(recon[princ].min()) >= float(recon[~princ].max()) - 1e-6
    low = M.make_mask("low_magnitude", W, alpha=0.3, k=4, spectrum=spec, gen=g)
    assert float(W.abs()[low].max()) <= float(W.abs()[~low].min())
    safe = M.make_mask("safe", W, alpha=0.3, k=4, spectrum=spec, gen=g)
    assert torch.equal(safe, low | ~princ)
    assert torch.equal(M.make_mask("nonprincipal", W, alpha=0.3, k=4, spectrum=spec, gen=g), ~princ)
    rnd = M.make_mask("random", W, alpha=0.3, k=4, spectrum=spec, gen=g)
    assert int(rnd.sum()) == int(round(float(safe.double().mean()) * W.numel())) and not torch.equal(rnd, safe)


# ---------------------------------------------------------------------------------------------
# SVD cache and saving
# ---------------------------------------------------------------------------------------------


def test_svd_cache_is_shared_across_cells_and_keyed_by_content(base, tmp_path):
    p1 = build_adapter(copy.deepcopy(base), cell("lora", init="pissa"), results_dir=tmp_path)
    sc = p1.fingerprint["svd_cache"]
    assert sc["misses"] == 14 and sc["hits"] == 0
    files = sorted((tmp_path / "svd_cache" / sc["model_key"]).glob("*.pt"))
    assert len(files) == 14
    p2 = build_adapter(copy.deepcopy(base), cell("dora", init="rlmo", rank=4), results_dir=tmp_path)
    assert p2.fingerprint["svd_cache"]["hits"] == 14 and p2.fingerprint["svd_cache"]["misses"] == 0
    p3 = build_adapter(copy.deepcopy(base), cell("full", mask="principal"), results_dir=tmp_path)
    assert p3.fingerprint["svd_cache"]["hits"] == 14  # masks read the same per-module files
    # the cached spectrum gives the same init as a fresh SVD
    fresh = build_adapter(copy.deepcopy(base), cell("lora", init="pissa"))
    assert p1.fingerprint["init_checksum"] == fresh.fingerprint["init_checksum"]
    # another model (same names) gets another key; a corrupt file is recomputed, not trusted
    other = tiny_model(seed=5)
    p4 = build_adapter(other, cell("lora", init="olora"), results_dir=tmp_path)
    assert p4.fingerprint["svd_cache"]["model_key"] != sc["model_key"]
    files[0].write_bytes(b"garbage")
    p5 = build_adapter(copy.deepcopy(base), cell("lora", init="pissa"), results_dir=tmp_path)
    assert p5.fingerprint["svd_cache"]["misses"] == 1
    assert p5.fingerprint["init_checksum"] == p1.fingerprint["init_checksum"]


def test_svd_cache_grows_for_larger_ranks(tmp_path):
    from lorarl.adapters.svd_cache import SVDCache

    W = torch.randn(200, 150)
    c = SVDCache(tmp_path, "k")
    assert c.get("w", W, 8).K == 64
    c2 = SVDCache(tmp_path, "k")
    assert c2.get("w", W, 100).K == 128 and c2.stats["misses"] == 1  # recomputed with more vectors
    assert SVDCache(tmp_path, "k").get("w", W, 70).K == 128  # and shared from then on


def _ranks_get(root: str, queue) -> None:  # one "rank": every module's spectrum from the shared cache
    from lorarl.adapters.svd_cache import SVDCache

    c = SVDCache(root, "k")
    gen = torch.Generator().manual_seed(0)
    S = [c.get(f"m{i}", torch.randn(96, 64, generator=gen), 8).S for i in range(6)]
    queue.put((c.stats["misses"], c.stats["hits"], torch.stack(S).tolist()))


def test_svd_cache_computes_each_module_once_across_concurrent_ranks(tmp_path):
    """Ranks of one job share results/svd_cache; its file lock makes each module's SVD one rank's work, and
    every rank gets the same spectrum (tests/slurm/test_distributed_slurm.py checks it in a 2-task job)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_ranks_get, args=(str(tmp_path), q)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sum(m for m, _, _ in got) == 6 and all(m + h == 6 for m, h, _ in got), [g[:2] for g in got]
    assert got[0][2] == got[1][2]  # the same spectra, bit for bit


@pytest.mark.parametrize("method,init", [("lora", "pissa"), ("dora", "milora"), ("rslora", "olora_tail"),
                                         ("lora", "rlpo")])
def test_saved_adapter_on_the_original_base_reproduces_the_trained_policy(base, ids, tmp_path, method, init):
    from peft import PeftModel

    policy = build_adapter(copy.deepcopy(base), cell(method, init=init, rank=4))
    for step in range(2):
        train_step(policy, ids, step)
    with torch.no_grad():
        trained = policy.model(ids).logits
    policy.save(tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter").eval()
    with torch.no_grad():
        again = loaded(ids).logits
    assert float((again - trained).abs().max()) < 1e-4
    assert (tmp_path / "adapter" / "lorarl_adapter.json").exists()
