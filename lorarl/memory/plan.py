"""The memory plan of one cell: projected peak bytes of its job on one device, and what fits.

A job holds, all the time (``static``): the policy's weights in their load dtype (lorarl.numerics.precision),
the trainable parameters' fp32 master copy + gradient + AdamW's two moments (full fine-tuning under
bf16-mixed: the fp32 weights are the master), the frozen KL reference (bf16 on GPU, when ``beta > 0`` or KL
monitors run), the distillation teacher / HF PRM of its regime when they sit on the policy's GPU, and a
colocated vLLM engine's ``gpu_memory_utilization`` share (unless it sleeps during the update). On top,
the largest of three phases:

* update: activations of one micro-batch of ``m`` rows of ``S = prompt + completion`` tokens (all layers
  without checkpointing; with it, every layer's input + one layer recomputed), plus TRL's fused LM head
  (``trl.trainer.utils.add_fused_lm_head``, TRL >= 1.16): no full-vocabulary logits; the head projects
  tiles of at most ``LM_TILE_TOKENS`` tokens x ``LM_TILE_VOCAB`` vocabulary columns into one buffer in the
  compute dtype (on a GPU only the completion positions are scored; elsewhere every position), plus the
  saved hidden states and their fp32 gradient;
* rollout (HF engine): the KV cache of ``g`` sequences of ``S`` tokens, one layer's prefill activations;
* scoring: the old-policy/reference forward of ``m`` rows and the teacher's (fused head) / PRM's (full
  logits: it reads two label tokens' probabilities) of their batch size.

Per token and layer, activations keep ``5h + q + 2 kv + 4 i`` values in the compute dtype (norm outputs,
attention input/output, q/k/v, the MLP's gate, up, activation and product) and the two RMSNorm inputs in
fp32; without a fused attention kernel (CPU) the attention scores and probabilities add ``2 heads S``.
Budget = ``HEADROOM`` x the device's memory (10% left to the allocator, CUDA context and fragmentation).

On ``W`` ranks (lorarl.memory.ranks) every figure is one rank's GPU: ``rows`` and ``batch`` are the rank's
share of the global batch; DDP keeps a full replica plus its flat gradient buckets (one more copy of the
trainable gradients); FSDP2 keeps ``1/W`` of the weights, trainable state and reference plus the
unsharded buffers of :func:`fsdp_gather_bytes`. The teacher / PRM are not sharded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lorarl.language.evalplan.lengths import prompt_tokens
from lorarl.memory.arch import Arch, PlanError, arch_for

GIB = 2**30
HEADROOM = 0.90  # the share of the device the plan may fill
LM_TILE_TOKENS = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
LM_TILE_VOCAB = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE: the tile's width whatever the vocabulary
LORA_FAMILY = ("lora", "rslora", "lora_plus", "dora", "adalora")


@dataclass
class Shape:
    """What sets one cell's memory (the numbers the formulas read)."""

    arch: Arch
    device: str  # cuda | cpu
    precision: str  # resolved train.precision
    method: str  # adapter.method
    trainable: int  # trainable parameters
    frozen_fp32: int  # frozen adapter tensors kept in fp32 (LoRA-FA's A, VeRA's shared matrices)
    rows: int  # sequences per optimiser update (rollout batch / PPO mini-batches)
    batch: int  # sequences per rollout (P x G)
    prompt: int  # prompt tokens
    completion: int  # completion tokens
    reference: bool  # a frozen KL reference is held
    aux: list[tuple[str, Arch, int, int]] = field(default_factory=list)  # (role, arch, bytes/param, batch)
    vllm_share: float = 0.0  # colocated vLLM's reserved share of the GPU during the update
    engine: str = "hf"
    world: int = 1  # training ranks (lorarl.memory.ranks); rows and batch above are one rank's share
    strategy: str = "single"  # single | ddp | fsdp2 (lorarl.memory.ranks.strategy_for)


def _adapter_counts(arch: Arch, adapter: Any) -> tuple[int, int]:
    """(trainable, frozen fp32) parameters of the adapter (all of them for ``full``)."""
    method, r = adapter.method, adapter.rank or 8
    if method == "full":
        return arch.params(), 0
    targets = adapter.target_modules
    lin = [x for x in arch.linears() if targets in (None, "all-linear") or not isinstance(targets, list)
           or x[0] in targets]
    L = arch.layers
    if method in LORA_FAMILY:
        extra = sum(o for _, _, o in lin) if method == "dora" else 0  # DoRA's magnitude vector
        return L * (sum(r * (i + o) for _, i, o in lin) + extra), 0
    if method == "lora_fa":  # A frozen (kept fp32), B trained
        return L * sum(r * o for _, _, o in lin), L * sum(r * i for _, i, _ in lin)
    if method == "vera":  # per-layer scaling vectors; shared random A/B of the largest shape
        return L * sum(r + o for _, _, o in lin), r * (max(i for _, i, _ in lin) + max(o for _, _, o in lin))
    if method == "miss":
        return L * sum(r * o for _, _, o in lin), 0
    if method == "ia3":  # k, v outputs and the down projection's input
        return L * (2 * arch.kv_heads * arch.hd + arch.intermediate), 0
    if method == "ln_tuning":
        return L * 2 * arch.hidden + arch.hidden, 0
    raise PlanError(f"adapter.method {method!r}: the memory plan has no formula; allowed: full, lora_fa, vera, "
                    f"miss, ia3, ln_tuning, {', '.join(LORA_FAMILY)}")


def _dtype_bytes(name: str, device: str) -> int:
    if name in ("float32", "fp32"):
        return 4
    if name == "auto":
        return 2 if device == "cuda" else 4  # hub checkpoints are bf16; the local recipes are saved fp32
    return 2


def shape_of(cfg: Any, device: str = "cuda", results_dir: str = "results") -> tuple[Shape, list[str]]:
    """The cell's :class:`Shape` on ``device`` (cuda: what its GPU job runs; cpu: a CPU job)."""
    from lorarl.numerics.kl import needs_reference
    from lorarl.numerics.precision import resolve_precision
    from lorarl.rewards.registry import extra_models

    t, rw = cfg.train, cfg.reward
    arch = arch_for(cfg.model, results_dir)
    precision = resolve_precision(t.precision, device)
    trainable, frozen = _adapter_counts(arch, cfg.adapter)
    prompt, note = prompt_tokens(cfg)
    aux = [(x.role, arch_for(x.model, results_dir), _dtype_bytes(x.dtype, device), x.batch_size)
           for x in extra_models(rw)]  # the regime's teacher / HF PRM
    vllm = cfg.rollout.gpu_memory_utilization if cfg.rollout.engine == "vllm" and not cfg.rollout.sleep_mode else 0.0
    shape = Shape(arch, device, precision, cfg.adapter.method, trainable, frozen,
                  t.prompts_per_step * t.generations // t.updates_per_generation, t.prompts_per_step * t.generations,
                  prompt, t.max_completion_length, needs_reference(t.beta, t.kl_monitor_every), aux,
                  vllm, cfg.rollout.engine)
    return shape, [note] if note else []


# ----------------------------------------------------------------------------- the formulas (bytes)
def compute_bytes(s: Shape) -> int:
    return 4 if s.precision == "fp32" else 2


def act_per_token_layer(a: Arch, cbytes: int, seq: int, fused_attention: bool) -> float:
    """Bytes one token keeps per layer for the backward (see the module docstring)."""
    h, q, kv, i = a.hidden, a.heads * a.hd, a.kv_heads * a.hd, a.intermediate
    out = cbytes * (5 * h + q + 2 * kv + 4 * i) + 2 * 4 * h
    if not fused_attention:
        out += cbytes * 2 * a.heads * seq
    return out


def static_parts(s: Shape, aux_here: bool) -> dict[str, float]:
    """Bytes held for the whole job: weights, trainable state, reference, auxiliary models, vLLM."""
    p = s.arch.params()
    full = s.method == "full"
    wbytes = 4 if s.precision == "fp32" or (full and s.precision == "bf16-mixed") else 2
    tbytes = 2 if s.precision == "bf16-pure" else 4
    parts = {"weights": p * wbytes + s.frozen_fp32 * 4,
             "trainable_state": s.trainable * (tbytes * 3 if full else tbytes * 4),  # (master) + grad + 2 moments
             "reference": p * (4 if s.precision == "fp32" else 2) if s.reference else 0}
    if s.strategy == "fsdp2":  # each rank keeps 1/W of parameters, gradients, AdamW states (and the reference)
        parts = {k: v / s.world for k, v in parts.items()}
        parts["fsdp_gather"] = fsdp_gather_bytes(s)
    elif s.strategy == "ddp":  # the reducer's flat gradient buckets: one more copy of the trainable gradients
        parts["ddp_buckets"] = s.trainable * tbytes
    for role, arch, nbytes, _ in s.aux:
        parts[role] = arch.params() * nbytes if aux_here else 0
    return parts


def fsdp_gather_bytes(s: Shape) -> float:
    """FSDP2's unsharded buffers on a rank: the root module's parameters (embedding, final norm, an untied
    LM head: gathered for the whole forward and backward) and one decoder layer's, all-gathered in the
    compute dtype; full fine-tuning also holds that layer's and the root's unsharded gradients until the
    reduce-scatter."""
    a = s.arch
    layer = sum(i * o for _, i, o in a.linears()) + 2 * a.hidden
    root = a.vocab * a.hidden * (1 if a.tie_embeddings else 2) + a.hidden
    return (root + layer) * compute_bytes(s) * (2 if s.method == "full" else 1)


def lm_head_bytes(s: Shape, arch: Arch, rows: int, cb: int, grad: bool) -> float:
    """TRL's fused LM head over ``rows`` sequences: one tile buffer, the hidden states (and their gradient)."""
    seq = s.prompt + s.completion
    scored = rows * (s.completion if s.device == "cuda" else seq - 1)
    return min(scored, LM_TILE_TOKENS) * LM_TILE_VOCAB * cb + scored * arch.hidden * (cb + (4 if grad else 0))


def update_bytes(s: Shape, m: int, checkpointing: bool) -> float:
    """Activations + the fused LM head of one micro-batch of ``m`` rows in the update."""
    a, cb = s.arch, compute_bytes(s)
    seq = s.prompt + s.completion
    per = act_per_token_layer(a, cb, seq, s.device == "cuda")
    tokens = m * seq
    acts = tokens * (a.layers * a.hidden * cb + per) if checkpointing else tokens * a.layers * per
    return acts + lm_head_bytes(s, a, m, cb, True)


def rollout_bytes(s: Shape, g: int) -> float:
    """HF generation of ``g`` sequences at once: KV cache + one layer's prefill + the sampling logits."""
    if s.engine != "hf":
        return 0.0
    a, cb = s.arch, compute_bytes(s)
    seq = s.prompt + s.completion
    kv = g * seq * a.layers * 2 * a.kv_heads * a.hd * cb
    return kv + g * s.prompt * act_per_token_layer(a, cb, s.prompt, s.device == "cuda") + g * a.vocab * 8


def scoring_bytes(s: Shape, m: int, aux_here: bool) -> float:
    """No-grad forwards: old policy / reference on ``m`` rows; teacher / PRM on their batch (when here)."""
    seq = s.prompt + s.completion

    def fwd(arch: Arch, rows: int, cb: int, fused: bool = True) -> float:
        acts = rows * seq * act_per_token_layer(arch, cb, seq, s.device == "cuda")
        head = lm_head_bytes(s, arch, rows, cb, False) if fused else rows * seq * arch.vocab * (cb + 4)
        return acts + head

    out = fwd(s.arch, m, compute_bytes(s))
    if aux_here:
        out = max([out] + [fwd(arch, b, nbytes, role == "teacher") for role, arch, nbytes, b in s.aux])
    return out


def aux_gpu_bytes(s: Shape) -> float:
    """Peak of a second GPU holding the teacher / PRM (weights + its forward)."""
    seq = s.prompt + s.completion
    out = 0.0
    for role, arch, nb, b in s.aux:
        head = lm_head_bytes(s, arch, b, nb, False) if role == "teacher" else b * seq * arch.vocab * (nb + 4)
        out = max(out, arch.params() * nb + b * seq * act_per_token_layer(arch, nb, seq, True) + head)
    return out


def peak_bytes(s: Shape, m: int, g: int, checkpointing: bool, aux_here: bool, gpu_bytes: float = 0.0) -> dict:
    """Every part and the peak (bytes) at micro-batch ``m``, generation chunk ``g``."""
    parts = static_parts(s, aux_here)
    parts["vllm_engine"] = s.vllm_share * gpu_bytes
    phases = {"update": update_bytes(s, m, checkpointing), "rollout": rollout_bytes(s, g),
              "scoring": scoring_bytes(s, m, aux_here)}
    static = sum(parts.values())
    worst = max(phases, key=phases.get)
    return {**parts, **{f"phase_{k}": v for k, v in phases.items()}, "static": static,
            "peak": static + phases[worst], "worst_phase": worst}


def largest(fits: Any, hi: int) -> int:
    """The largest n in [1, hi] with fits(n) (fits is monotone: more rows, more memory); 0 if none."""
    lo, best = 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
