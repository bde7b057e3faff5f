"""What many end-to-end tests start from, built once per pytest session and copied per test.

`tiny_test_base`: the `local:tiny-test` base model (lorarl.models.build_base: the recipe's tokenizer, architecture
and SFT, about 7 s of CPU), as the `base_model` rule builds it into `results/models/tiny-test`. A test puts its own
copy where its study looks for it with `place_base(tiny_test_base, root)` (`root/models/tiny-test`, the folder a
study's `local:tiny-test` resolves to under results `root`): a copy per test, so a test that writes into it
cannot reach another. Its files keep the built model's times, older than anything the test writes, so Snakemake
takes it as made (no `base_model` job) and a later job's outputs stay newer than it.

Registered for every test module by tests/conftest.py (`pytest_plugins`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_test_base(tmp_path_factory) -> Path:
    """The built `local:tiny-test` model (read it, or copy it with place_base; never write into it)."""
    from lorarl.models import build_base

    base = tmp_path_factory.mktemp("tiny_test_base") / "models" / "tiny-test"
    build_base("tiny-test", base, threads=1)
    return base


def place_base(built: Path, root: Path) -> Path:
    """A copy of the built model at ``root/models/tiny-test`` (``root``: a results folder); its path."""
    dest = Path(root) / "models" / "tiny-test"
    shutil.copytree(built, dest)  # copy2: the built files' times kept
    return dest


def perturbed_teacher(model_dir: Path, out: Path) -> Path:
    """A copy of the model at ``model_dir`` with seeded noise (0.05 sd) on every weight, saved at ``out``: a
    distillation teacher that differs from the policy, so rewards are dense and varied and the adapter really moves."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
