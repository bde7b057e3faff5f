"""The acceptance run's time budget (``--minutes M``): what each check is estimated to cost before it starts.

Two calibrations feed every estimate, both measured in this run:

* **job start-up** (:func:`job_start_s`): a fresh process importing what a training job imports (torch,
  transformers, peft, TRL, MLflow and lorarl's train stage), timed; a check that starts ``n`` job processes
  pays it ``n`` times. After the first doctor job the measured overhead (its wall time less its steps) is used.
* **a twin's step** (:func:`calibrate`): the twin's model on the device, in this process: seconds per decoded
  token for the twin's ``P x G`` rows (8 tokens after a warm-up) and seconds per trained token of a forward +
  backward; a step of completion ``C`` is ``C`` decoded tokens plus ``rows x C`` tokens forward + backward
  twice (the reference and old-policy passes are about one more), as lorarl's step split has it.

A check starts only when the run's elapsed time plus its estimate fits the budget; otherwise its rows read
``not run: budget (estimated N s, M s left)``. Each started check records its estimate beside its wall time,
so the report shows how good the estimates were.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

TRAIN_IMPORTS = "import torch, transformers, peft, trl, mlflow; import lorarl.train.main"


def job_start_s() -> float:
    """Seconds a fresh process takes to import a training job's stack (what every job process pays first)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", TRAIN_IMPORTS], check=True, capture_output=True)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Speed:
    """A twin's measured speed on this device."""

    decode_s_per_token: float  # one decoding step for all P x G rows
    train_s_per_token: float  # forward + backward, per trained token
    load_s: float  # loading the model onto the device

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
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return Speed(decode, train, load)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


@dataclass
class Budget:
    """The run's clock against ``minutes`` (None: no budget, every check runs)."""

    minutes: float | None
    t0: float

    def left_s(self) -> float:
        return float("inf") if self.minutes is None else self.minutes * 60 - (time.perf_counter() - self.t0)

    def fits(self, estimate_s: float) -> bool:
        return estimate_s <= self.left_s()

    def why_not(self, estimate_s: float) -> str:
        return f"budget (estimated {estimate_s:.0f} s, {max(self.left_s(), 0):.0f} s left of {self.minutes:g} min)"


def doctor_estimate(start_s: float, speed: Speed, rows: int, completion: int, steps: int, eval_limit: int) -> float:
    """``lorarl doctor`` on a twin: a launcher process and a job process, the model loaded for training, the
    reference and evaluation, ``steps`` steps, ``eval_limit`` problems decoded one batch (and the base's first
    problem alone), and the doctor's own probes (a fresh aggregation, a dry run: about one start-up more)."""
    return (3 * start_s + 3 * speed.load_s + steps * speed.step_s(rows, completion)
            + 2 * completion * speed.decode_s_per_token)


def pack_estimate(start_s: float, speed: Speed, rows: int, completion: int, steps: int, k: int) -> float:
    """A pack job of ``k`` members and ``k`` solo jobs: ``k + 1`` processes, ``2k`` members' steps."""
    return (k + 1) * (start_s + 2 * speed.load_s) + 2 * k * steps * speed.step_s(rows, completion)


def dist_estimate(start_s: float, speed: Speed, rows: int, completion: int, steps: int) -> float:
    """One rank under torchrun: the launcher's start, a job process, ``steps`` steps."""
    return 2 * start_s + 2 * speed.load_s + steps * speed.step_s(rows, completion)


def record(row: dict[str, Any], estimate_s: float, wall_s: float) -> dict[str, Any]:
    """Note a check's estimate and its wall time in its row (the report's budget columns)."""
    row["data"]["estimate_s"] = round(estimate_s, 1)
    row["data"]["wall_s"] = round(wall_s, 1)
    return row
