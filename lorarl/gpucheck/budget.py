"""The acceptance run's time budget (``--minutes M``): every row's need estimated before it starts, and its bound.

The budget runs from the gpucheck process's start (its interpreter and imports count). Three calibrations feed the
estimates, all measured in this run:

* **job start-up** (:func:`job_start_s`): a fresh process importing what a training job imports (torch,
  transformers, peft, TRL, MLflow and lorarl's train stage), timed; a check that starts ``n`` job processes
  pays it ``n`` times. The probe itself is bounded by the budget (cut: its time so far is a lower bound).
* **a twin's speed** (:func:`calibrate`): the twin's model on the device, in this process: seconds per decoded
  token for the twin's ``P x G`` rows (8 tokens after a warm-up), seconds per trained token of a forward +
  backward, and one float64 SVD of an MLP matrix (the doctor's weight diagnostics are such SVDs).
* **the earlier rows of the run** (:meth:`Budget.factor`): each started check records its wall time beside its
  estimate; a later check's need is its estimate x the mean ratio so far (clamped to [0.5, 4]).

A check starts only when its need fits what is left (less :data:`RESERVE_S` for writing the report); otherwise its
rows read ``skipped (needs ~N s, M s left)``. A started check gets its own bound (:meth:`Budget.bound`: three times
its need, at least two minutes more, never past the budget): its processes still running then are killed
(lorarl.gpucheck.checks.sub) and its rows read ``cut`` with what it measured. So every row ends within the budget
and the report, rewritten after each row, always lists every row at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

TRAIN_IMPORTS = "import torch, transformers, peft, trl, mlflow; import lorarl.train.main"


def job_start_s(bound_s: float | None = None) -> tuple[float, bool]:
    """(seconds, finished): a fresh process importing a training job's stack (what every job process pays first);
    killed at ``bound_s`` (then not finished, and the seconds are a lower bound)."""
    t0 = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", TRAIN_IMPORTS], check=True, capture_output=True, timeout=bound_s)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, False
    return time.perf_counter() - t0, True


@dataclass(frozen=True)
class Speed:
    """A twin's measured speed on this device."""

    decode_s_per_token: float  # one decoding step for all P x G rows
    train_s_per_token: float  # forward + backward, per trained token
    load_s: float  # loading the model onto the device
    svd_s: float = 0.0  # one float64 SVD of a hidden x intermediate matrix on the device (the diagnostics' unit)

    def step_s(self, rows: int, completion: int, prompt: int = 32) -> float:
        """One GRPO step: sampling ``completion`` tokens for ``rows`` rows, then ~3 passes over them."""
        tokens = rows * (prompt + completion)
        return completion * self.decode_s_per_token + 3 * tokens * self.train_s_per_token


def calibrate(model_dir: str, rows: int, device: str) -> Speed:
    """Time the twin's model here: load, 8 decoding steps for ``rows`` rows, one forward + backward."""
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    load = time.perf_counter() - t0
    ids_BT = torch.randint(0, model.config.vocab_size, (rows, 16), device=device)
    with torch.no_grad():
        model.generate(ids_BT, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm-up (kernels, caches)
        _sync(device)
        t0 = time.perf_counter()
        model.generate(ids_BT, max_new_tokens=10, min_new_tokens=10, do_sample=False)
        _sync(device)
    decode = (time.perf_counter() - t0) / 10
    seq_BT = torch.randint(0, model.config.vocab_size, (rows, 64), device=device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        model(seq_BT).logits.float().mean().backward()  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        model(seq_BT).logits.float().mean().backward()
        _sync(device)
    train = (time.perf_counter() - t0) / seq_BT.numel()
    cfg = model.config
    w_DN = torch.randn(cfg.hidden_size, cfg.intermediate_size, dtype=torch.float64, device=device)
    t0 = time.perf_counter()
    torch.linalg.svd(w_DN, full_matrices=False)
    _sync(device)
    svd = time.perf_counter() - t0
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return Speed(decode, train, load, svd)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


RESERVE_S = 5.0  # kept back from the budget for the report's last writes
BOUND_FACTOR = 3.0  # a started check may run this many times its need (the estimates were off by up to 1.9x)
BOUND_MIN_EXTRA_S = 120.0  # and at least this much past its need (a CPU smoke's short checks vary under load)
FACTOR_RANGE = (0.5, 4.0)  # what the earlier rows' wall/estimate ratio may scale a later estimate by


@dataclass
class Budget:
    """The run's clock against ``minutes`` (None: no budget, every check runs unbounded); ``t0``: its start
    (time.perf_counter), the process's start where known."""

    minutes: float | None
    t0: float
    ratios: list[float] = field(default_factory=list)  # wall / estimate of each started check so far

    def left_s(self) -> float:
        return float("inf") if self.minutes is None else self.minutes * 60 - (time.perf_counter() - self.t0)

    def factor(self) -> float:
        """The mean wall/estimate ratio of the checks so far (1 before any), clamped to FACTOR_RANGE."""
        if not self.ratios:
            return 1.0
        return min(max(sum(self.ratios) / len(self.ratios), FACTOR_RANGE[0]), FACTOR_RANGE[1])

    def need(self, estimate_s: float) -> float:
        """A check's estimate as the run's earlier checks calibrate it."""
        return estimate_s * self.factor()

    def fits(self, need_s: float) -> bool:
        return need_s <= self.left_s() - (RESERVE_S if self.minutes is not None else 0.0)

    def skipped(self, need_s: float) -> str:
        """Why a check did not start: ``skipped (needs ~N s, M s left)``."""
        left = max(self.left_s() - RESERVE_S, 0.0)
        return f"skipped (needs ~{need_s:.0f} s, {left:.0f} s left of {self.minutes:g} min)"

    def bound(self, need_s: float) -> float | None:
        """Seconds a started check may run: BOUND_FACTOR x its need (BOUND_MIN_EXTRA_S more at least), never past
        the budget (a check far past its need is cut so the checks after it keep their time)."""
        if self.minutes is None:
            return None
        return max(min(max(BOUND_FACTOR * need_s, need_s + BOUND_MIN_EXTRA_S), self.left_s() - RESERVE_S), 0.0)

    def took(self, estimate_s: float, wall_s: float) -> None:
        """A started check's wall time against its raw estimate (a cut one's is a lower bound, kept as is)."""
        if estimate_s > 0:
            self.ratios.append(wall_s / estimate_s)


def model_size(arch: Any) -> float:
    """Weights of a lorarl.gpucheck.shapes.Arch (attention as 4 hidden^2, the MLP's 3 matrices, the embedding and
    an untied head): what a later twin's build and calibration is scaled by from an earlier one's."""
    return arch.layers * (4 * arch.hidden ** 2 + 3 * arch.hidden * arch.intermediate) + \
        arch.vocab * arch.hidden * (1 if arch.tie else 2)


GENERATE_SLOWDOWN = 1.5  # the trainer's HF generate against the calibration's: 46 s/step vs 32 s (H200, 512 tokens)
SVDS_PER_MATRIX = 4  # the diagnostics' float64 SVDs per adapted matrix (base, trained, their spectra and angles)
ADAPTED_PER_LAYER = 7  # all-linear LoRA: q, k, v, o, gate, up, down


def doctor_estimate(start_s: float, speed: Speed, rows: int, completion: int, steps: int, eval_limit: int,
                    layers: int = 0) -> float:
    """``lorarl doctor`` on a twin, from bench/results/gpucheck-h200.md's third run (where its job spent its time):
    a launcher, a job process and the doctor's own probes (a fresh aggregation, a dry run): 3 start-ups; the model
    loaded for training, the reference and evaluation; ``steps`` steps plus the first one's warm-up (one more), the
    trainer's generation GENERATE_SLOWDOWN slower than the calibration's; the evaluation: the first problem alone,
    then the batch, for the trained and the base model (4 completions' decoding); the weight diagnostics: float64
    SVDs of every adapted matrix (``layers`` x ADAPTED_PER_LAYER, SVDS_PER_MATRIX each at the calibrated SVD)."""
    step = speed.step_s(rows, completion) + (GENERATE_SLOWDOWN - 1) * completion * speed.decode_s_per_token
    return (3 * start_s + 3 * speed.load_s + (steps + 1) * step + 4 * completion * speed.decode_s_per_token
            + layers * ADAPTED_PER_LAYER * SVDS_PER_MATRIX * speed.svd_s)


def pack_estimate(start_s: float, speed: Speed, rows: int, completion: int, steps: int, k: int) -> float:
    """A pack job of ``k`` members and ``k`` solo jobs: ``k + 1`` processes, ``2k`` members' steps."""
    return (k + 1) * (start_s + 2 * speed.load_s) + 2 * k * steps * speed.step_s(rows, completion)


def dist_estimate(start_s: float, speed: Speed, rows: int, completion: int, steps: int) -> float:
    """One rank under torchrun: the launcher's start, a job process, ``steps`` steps."""
    return 2 * start_s + 2 * speed.load_s + steps * speed.step_s(rows, completion)


def record(row: dict[str, Any], estimate_s: float, wall_s: float, need_s: float | None = None) -> dict[str, Any]:
    """Note a check's estimate (and its need: the estimate as the earlier rows calibrate it) and its wall time in
    its row (the report's budget columns)."""
    row["data"]["estimate_s"] = round(estimate_s, 1)
    if need_s is not None:
        row["data"]["need_s"] = round(need_s, 1)
    row["data"]["wall_s"] = round(wall_s, 1)
    return row
