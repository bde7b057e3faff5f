"""Toy check of the rank-dependent KL bound (paper 000, Theorem 1 and §5.1) on Optdigits.

Model (the paper's Table 1, taken literally): x ∈ R^k (k = 64 pixels) → logits
z = (W0 + B A) x ∈ R^d (d = 256; W0 ∈ R^{d×k} frozen, B ∈ R^{d×r}, A ∈ R^{r×k}, no bias, no LoRA
scale) → π(x) = σ(z) ∈ (0,1)^d, trained with the d-summed BCE against binary labels y ∈ {0,1}^d.
Fine-tuning is plain SGD on (A, B) with the paper's gradients (Eq. 1a/1b), global-norm clipping,
run in float64 (an lr of 1e-8 moves entries by ~1e-13: float32 would round every step away).

For every (rank, seed) we record the empirical KL between π_θ0 and π_θt on the held-out inputs and
the bound μ(r)·e^{μ(r)}, μ(r) = √(rk)(‖B0‖₂‖ΔA_t‖₂ + ‖A0‖₂‖ΔB_t‖₂), plus every intermediate quantity
of the proof so the chain KL ≤ ‖δ‖∞e^{‖δ‖∞} ≤ μe^μ can be checked link by link. See `ASSUMPTIONS`
for the choices the paper leaves open. Everything is numpy (faster than torch for these tiny
matrices); the cached base is a dict of float64 torch tensors so `torch.save` can hold it.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from lorarl.language.toy import KLBoundConfig

K_INPUTS = 64  # Optdigits: 8×8 images
N_CLASSES = 10

ASSUMPTIONS = """\
Choices where paper 000 (section 5.1) is ambiguous, made so the proof of Theorem 1 stays valid:
1. Output head: none. The adapted projection W0 + BA (d=256 x k=64) IS the output layer and its
   d sigmoid units are the policy, exactly the model of the paper's Table 1 (pi = sigma(z),
   y in {0,1}^d, BCE summed over d). Optdigits has 10 classes, so each digit gets a fixed random
   binary codeword in {0,1}^256 (an error-correcting output code drawn from pretrain_seed; no unit
   is constant over classes); unit j classifies a random subset of digits. A head after the
   projection would put its Lipschitz constant into the bound, which the paper's bound omits.
2. KL: at an input x_e the policy is the distribution over (unit j ~ uniform{1..d}, bit b ~
   Bernoulli(sigma(z_j))), so KL(pi_t || pi_0)(x_e) = mean_j KL(Bern(sigma(z_t,j)) ||
   Bern(sigma(z_0,j))). This is a proper KL (the sigmoid outputs do not sum to 1, so the paper's
   sum over them is not), and each log-ratio obeys |delta| <= |dz_j| exactly (log sigma is
   1-Lipschitz), so KL(x_e) <= ||delta||_inf <= ||dz||_inf with no first-order approximation.
   `kl` is the mean over held-out inputs, `kl_max` the max; the bound is checked against both.
3. Inputs: pixels standardised on the training split, then each image rescaled to
   ||x||_2 = sqrt(k), so Assumption 2's norm (||x_e||_2 <~ sqrt(k), used in Eq. 10) holds exactly.
4. Init: A0, B0 entries i.i.d. N(0, 1), as Assumption 1 requires (ordinary LoRA's B0 = 0 would
   leave mu = sqrt(rk)*||A0||*||dB|| only). Ranks of one seed are nested (rank r uses the first
   r rows of A0 / columns of B0 of one rank-64 draw) and share the batch order.
5. Reference policy pi_0 uses W0 + B0 A0 (the paper's z_0); subtract_init=True freezes
   W0 - B0 A0 instead, so pi_0 is the pretrained model. Fine-tuning reuses the pretraining data.
6. mu is the paper's; the dropped second-order term sqrt(rk)*||dB||*||dA|| is reported as
   mu_cross (~1e-16 at the defaults). Loss: batch mean of the d-summed BCE; plain SGD; float64.
"""


def _one_blas_thread(fn):
    """Run fn with single-threaded BLAS: these matrices are tiny, and multi-threaded OpenBLAS is
    ~5x slower here once the cores are shared (scheduling, not arithmetic)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from threadpoolctl import threadpool_limits  # a scikit-learn dependency

        with threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------- KL of sigmoid units
def bernoulli_kl(z0, dz) -> np.ndarray:
    """Elementwise KL(Bern(σ(z0+dz)) ‖ Bern(σ(z0))), stable for tiny dz and saturated z0.

    KL is the Bregman divergence of softplus f: KL = f(z0) − f(z) − σ(z)(z0 − z), z = z0 + dz. For
    |dz| < 1e-3 its Taylor series at z, ½f''dz² − ⅙f'''dz³ + (1/24)f''''dz⁴ (f'' = s(1−s),
    f''' = f''(1−2s), f'''' = f''(1−6s+6s²), s = σ(z)), has relative error < 1e-9; otherwise
    σ(z)δ₁ + σ(−z)δ₀ with the log-ratios δ₁ = −log1p(σ(−z0)·expm1(−dz)),
    δ₀ = −log1p(σ(z0)·expm1(dz)).
    """
    z0, dz = np.asarray(z0, np.float64), np.asarray(dz, np.float64)
    z = z0 + dz
    s = expit(z)
    f2 = s * expit(-z)
    series = dz**2 * f2 * (0.5 - dz * (1 - 2 * s) / 6 + dz**2 * (1 - 6 * s + 6 * s**2) / 24)
    with np.errstate(over="ignore", invalid="ignore"):
        d1, d0 = _log_ratios(z0, dz)
        direct = s * d1 + expit(-z) * d0
    return np.where(np.abs(dz) < 1e-3, series, np.maximum(direct, 0.0))


def _log_ratios(z0: np.ndarray, dz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """δ₁ = log σ(z0+dz) − log σ(z0), δ₀ = log σ(−z0−dz) − log σ(−z0), without cancellation."""
    return (-np.log1p(expit(-z0) * np.expm1(-dz)), -np.log1p(expit(z0) * np.expm1(dz)))


def policy_kl(z0_ED, dz_ED) -> np.ndarray:
    """KL(π_t ‖ π_0)(x_e) for each input row: mean over the d units of `bernoulli_kl`."""
    return bernoulli_kl(z0_ED, dz_ED).mean(axis=-1)


# ----------------------------------------------------------------------------- data and base
def _load_inputs(cfg: KLBoundConfig) -> dict:
    from sklearn.datasets import load_digits  # ships with scikit-learn, no download

    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng([cfg.pretrain_seed, 0])
    perm = rng.permutation(len(y))
    n_eval = int(round(cfg.eval_fraction * len(y)))
    ev, tr = perm[:n_eval], perm[n_eval:]
    mean, std = X[tr].mean(0), X[tr].std(0)
    X = (X - mean) / np.where(std > 0, std, 1.0)  # constant pixels become 0
    X = math.sqrt(K_INPUTS) * X / np.linalg.norm(X, axis=1, keepdims=True)
    code = rng.integers(0, 2, (N_CLASSES, cfg.d))
    while (bad := code.min(0) == code.max(0)).any():  # every unit must separate some digits
        code[:, bad] = rng.integers(0, 2, (N_CLASSES, int(bad.sum())))
    return {"X_train_NK": X[tr], "y_train_N": y[tr], "X_eval_EK": X[ev], "y_eval_E": y[ev],
            "code_CD": code.astype(np.float64)}


def _bce(Z, Y) -> float:
    """Mean over rows of the d-summed BCE with logits: Σ_j softplus(z) − y z."""
    softplus = np.maximum(Z, 0.0) + np.log1p(np.exp(-np.abs(Z)))
    return float((softplus - Y * Z).sum(1).mean())


def _decode_acc(Z, y, code) -> float:
    """Accuracy of maximum-likelihood decoding of the digit from the d unit logits."""
    ll = log_expit(Z) @ code.T + log_expit(-Z) @ (1 - code).T
    return float((ll.argmax(1) == y).mean())


@_one_blas_thread
def pretrain(cfg: KLBoundConfig) -> dict:
    """Fit the frozen base W0 (d×k) by ridge-regularised BCE with L-BFGS (strictly convex, so the
    result depends on cfg only). Returns float64 tensors W0_DK, X_*, y_*, code_CD plus metrics."""
    data = _load_inputs(cfg)
    X, Y = data["X_train_NK"], data["code_CD"][data["y_train_N"]]
    n, shape = len(X), (cfg.d, K_INPUTS)

    def fg(w):
        W = w.reshape(shape)
        Z = X @ W.T
        G = (expit(Z) - Y) / n
        loss = _bce(Z, Y) + 0.5 * cfg.pretrain_l2 * (w @ w)
        return loss, (G.T @ X).ravel() + cfg.pretrain_l2 * w

    res = minimize(fg, np.zeros(cfg.d * K_INPUTS), jac=True, method="L-BFGS-B",
                   options={"maxiter": cfg.pretrain_iters})
    W0 = res.x.reshape(shape)
    Ze = data["X_eval_EK"] @ W0.T
    metrics = {"train_bce": _bce(X @ W0.T, Y), "eval_bce": _bce(Ze, data["code_CD"][data["y_eval_E"]]),
               "eval_acc": _decode_acc(Ze, data["y_eval_E"], data["code_CD"]),
               "lbfgs_iters": int(res.nit)}
    base = {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in data.items()}
    base["W0_DK"] = torch.from_numpy(W0)
    base["pretrain_config"] = _pretrain_fields(cfg)
    base["metrics"] = metrics
    return base


def _pretrain_fields(cfg: KLBoundConfig) -> dict:
    return cfg.model_dump(include={"d", "eval_fraction", "pretrain_seed", "pretrain_l2",
                                   "pretrain_iters"})


def save_base(base: dict, path: str | os.PathLike) -> Path:
    """Cache a `pretrain` result with torch.save, atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    torch.save(base, tmp)
    os.replace(tmp, path)
    return path


def load_base(path: str | os.PathLike, cfg: KLBoundConfig | None = None) -> dict:
    """Load a cached base; with cfg, refuse one pretrained under different pretraining fields."""
    base = torch.load(path, weights_only=True)
    if cfg is not None and base["pretrain_config"] != _pretrain_fields(cfg):
        raise ValueError(f"{path} was pretrained with {base['pretrain_config']}, "
                         f"not {_pretrain_fields(cfg)}")
    return base


# ----------------------------------------------------------------------------- LoRA fine-tuning
def _prepare(base: dict) -> dict:
    """numpy views of the base and the frozen logits W0 x, shared by all (rank, seed) cells."""
    p = {k: v.numpy() for k, v in base.items() if isinstance(v, torch.Tensor)}
    p["Y_train_ND"] = p["code_CD"][p["y_train_N"]]
    p["Zw_train_ND"] = p["X_train_NK"] @ p["W0_DK"].T
    p["Zw_eval_ED"] = p["X_eval_EK"] @ p["W0_DK"].T
    return p


def lora_grads(X_BK, Zw_BD, Y_BD, A_RK, B_DR) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of the batch-mean, d-summed BCE at z = Zw + B A x (paper Eq. 1a/1b):
    g_i = (σ(z_i) − y_i)/n, ∇A = Σ_i Bᵀ g_i x_iᵀ, ∇B = Σ_i g_i x_iᵀ Aᵀ. Returns (∇A, ∇B)."""
    U_BR = X_BK @ A_RK.T
    G = expit(Zw_BD + U_BR @ B_DR.T)
    G -= Y_BD
    G /= len(X_BK)
    return (G @ B_DR).T @ X_BK, G.T @ U_BR


class _Adam:
    """torch.optim.Adam's update direction (lr applied by the caller): bias-corrected first moment
    over the square root of the bias-corrected second moment plus eps, per parameter."""

    def __init__(self, cfg: KLBoundConfig, shapes):
        self.b1, self.b2 = cfg.adam_betas
        self.eps, self.t = cfg.adam_eps, 0
        self.m = [np.zeros(s) for s in shapes]
        self.v = [np.zeros(s) for s in shapes]

    def step(self, grads):
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        out = []
        for m, v, g in zip(self.m, self.v, grads):
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            out.append((m / c1) / (np.sqrt(v / c2) + self.eps))
        return out


def _check_ranks(cfg: KLBoundConfig, ranks) -> None:
    bad = [r for r in ranks if not 1 <= r <= min(cfg.d, K_INPUTS)]
    if bad:
        raise ValueError(f"rank must be in [1, {min(cfg.d, K_INPUTS)}], got {bad}")


def _xexp(x: float) -> float:
    """x·e^x, +inf instead of OverflowError."""
    return x * math.exp(x) if x < 700 else math.inf


def _run(cfg: KLBoundConfig, p: dict, rank: int, seed: int, return_state: bool) -> dict:
    k, d = K_INPUTS, cfg.d
    init = np.random.default_rng([seed, 1])
    A0 = cfg.init_std * init.standard_normal((min(d, k), k))[:rank]  # nested across ranks
    B0 = cfg.init_std * init.standard_normal((d, min(d, k)))[:, :rank]
    X, Y, Zw = p["X_train_NK"], p["Y_train_ND"], p["Zw_train_ND"]
    Xe, Zwe = p["X_eval_EK"], p["Zw_eval_ED"]
    if cfg.subtract_init:
        Zw = Zw - (X @ A0.T) @ B0.T
        Zwe = Zwe - (Xe @ A0.T) @ B0.T
    dA, dB = np.zeros_like(A0), np.zeros_like(B0)
    adam = _Adam(cfg, (A0.shape, B0.shape)) if cfg.optimizer == "adam" else None
    order = np.random.default_rng([seed, 2])
    n, steps, clipped = len(X), 0, 0
    for _ in range(cfg.epochs):
        perm = order.permutation(n)
        for s in range(0, n, cfg.batch_size):
            idx = perm[s:s + cfg.batch_size]
            gA, gB = lora_grads(X[idx], Zw[idx], Y[idx], A0 + dA, B0 + dB)
            scale = 1.0
            if cfg.clip is not None:  # torch.nn.utils.clip_grad_norm_ semantics
                norm = math.sqrt(float(np.vdot(gA, gA) + np.vdot(gB, gB)))
                if norm > cfg.clip:
                    scale = cfg.clip / (norm + 1e-6)
                    clipped += 1
            if adam is not None:
                gA, gB = adam.step((scale * gA, scale * gB))
                scale = 1.0
            dA -= cfg.lr * scale * gA  # accumulate ΔA, ΔB apart from A0, B0: no rounding against O(1)
            dB -= cfg.lr * scale * gB
            steps += 1
    U0e, dUe = Xe @ A0.T, Xe @ dA.T
    z0 = Zwe + U0e @ B0.T                                  # z_0(x_e) = (W0 + B0A0) x_e
    dz = dUe @ B0.T + (U0e + dUe) @ dB.T                   # (B0ΔA + ΔB A0 + ΔBΔA) x_e
    kl_E = policy_kl(z0, dz)
    dlogpi_inf = float(np.max(np.maximum(*map(np.abs, _log_ratios(z0, dz)))))
    n2 = lambda M: float(np.linalg.norm(M, 2))  # noqa: E731 spectral norm
    nA0, nB0, ndA, ndB = n2(A0), n2(B0), n2(dA), n2(dB)
    srk = math.sqrt(rank * k)
    mu = srk * (nB0 * ndA + nA0 * ndB)
    out = {"rank": rank, "seed": seed, "kl": float(kl_E.mean()), "kl_max": float(kl_E.max()),
           "bound": _xexp(mu), "mu": mu, "mu_cross": srk * ndA * ndB,
           "dz_inf": float(np.abs(dz).max()), "dlogpi_inf": dlogpi_inf,
           "bound_eq8": _xexp(dlogpi_inf),
           "norm_A0": nA0, "norm_B0": nB0, "norm_dA": ndA, "norm_dB": ndB,
           "x_eval_norm_max": float(np.linalg.norm(Xe, axis=1).max()),
           "steps": steps, "clipped_frac": clipped / steps}
    if return_state:
        out["state"] = {"A0": A0, "B0": B0, "dA": dA, "dB": dB, "z0_eval": z0, "dz_eval": dz}
    return out


@_one_blas_thread
def run_one(cfg: KLBoundConfig, base: dict, rank: int, seed: int, *,
            return_state: bool = False) -> dict:
    """LoRA-fine-tune one (rank, seed) cell and return the KL and the Theorem 1 bound.

    Keys: rank, seed, kl (mean over held-out x_e of KL(π_t‖π_0)(x_e)), kl_max, bound = μe^μ, mu,
    mu_cross (dropped √(rk)‖ΔB‖‖ΔA‖), dz_inf = max|Δz|, dlogpi_inf = ‖δ‖∞, bound_eq8 = ‖δ‖∞e^{‖δ‖∞},
    norm_A0/B0/dA/dB (spectral), x_eval_norm_max, steps, clipped_frac; with return_state also
    "state" (A0, B0, dA, dB, z0_eval, dz_eval as numpy arrays). Chain: kl ≤ kl_max ≤ dlogpi_inf
    ≤ bound_eq8, dlogpi_inf ≤ dz_inf ≤ mu + mu_cross, and bound_eq8 ≤ bound when dz_inf ≤ mu.
    """
    _check_ranks(cfg, [rank])
    return _run(cfg, _prepare(base), int(rank), int(seed), return_state)


@_one_blas_thread
def run_many(cfg: KLBoundConfig, base: dict, ranks=None, seeds=None) -> list[dict]:
    """`run_one` over ranks × seeds (defaults: cfg.ranks, cfg.seeds) in this process, sharing the
    frozen logits; rows ordered rank-major."""
    ranks = [int(r) for r in (cfg.ranks if ranks is None else ranks)]
    seeds = [int(s) for s in (cfg.seeds if seeds is None else seeds)]
    _check_ranks(cfg, ranks)
    p = _prepare(base)
    return [_run(cfg, p, r, s, False) for r in ranks for s in seeds]
