"""The models a resumed run trains: the policy's base and a teacher."""

from __future__ import annotations

from pathlib import Path


def build_models(root: Path, built: Path) -> tuple[Path, Path]:
    """results/models/tiny-test (a copy of ``built``, the session's tiny_test_base) and a perturbed copy of it as
    the distillation teacher."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.trained import place_base

    base = place_base(built, root)
    teacher = root / "teacher"
    model, tok = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(teacher)
    tok.save_pretrained(teacher)
    return base, teacher
