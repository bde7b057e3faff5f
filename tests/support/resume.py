"""The models a resumed run trains: the policy's base and a teacher."""

from __future__ import annotations

from pathlib import Path


def build_models(root: Path) -> tuple[Path, Path]:
    """results/models/tiny-test (the recipe) and a perturbed copy of it as the distillation teacher."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lorarl.models import build_base

    base = root / "models" / "tiny-test"
    build_base("tiny-test", base, threads=1)
    teacher = root / "teacher"
    model, tok = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(teacher)
    tok.save_pretrained(teacher)
    return base, teacher
