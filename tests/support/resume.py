"""The models a resumed run trains: the policy's base and a teacher."""

from __future__ import annotations

from pathlib import Path


def build_models(root: Path, built: Path) -> tuple[Path, Path]:
    """results/models/tiny-test (a copy of ``built``, the session's tiny_test_base) and a perturbed copy of it as
    the distillation teacher."""
    from tests.support.trained import perturbed_teacher, place_base

    base = place_base(built, root)
    return base, perturbed_teacher(base, root / "teacher")
