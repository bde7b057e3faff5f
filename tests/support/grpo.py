"""The GRPO step's shared pieces: a fake grader, the tiny model's loader, a toy dataset and TRL arguments."""

from __future__ import annotations

import datasets


G = 2  # completions per prompt


P = 2  # prompts per step


MAXLEN = 8


def fake_score(completions, answers=None):
    """A deterministic, non-degenerate 'grade' of a completion's text."""
    return [float(sum(map(ord, c)) % 5) / 4 for c in completions]


def load(tiny_dir):
    from lorarl.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_dir)


def dataset(n=8):
    rows = [{"prompt": f"Q: {10 + i}+{20 + i}=?\nA: ", "answer": str(30 + 2 * i)} for i in range(n)]
    return datasets.Dataset.from_list(rows)


def args(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), learning_rate=1e-2, max_steps=2, per_device_train_batch_size=P * G,
                gradient_accumulation_steps=1, steps_per_generation=1, num_generations=G,
                max_completion_length=MAXLEN, temperature=1.0, beta=0.0, loss_type="grpo", seed=0, data_seed=0,
                logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                dataloader_num_workers=0)
    base.update(kw)
    return GRPOConfig(**base)


def raw_batch(ds):
    return [dict(r) for r in ds.select(range(P)) for _ in range(G)]


def metric_steps(trainer, name):
    return [h["step"] for h in trainer.state.log_history if h.get(name) is not None]
