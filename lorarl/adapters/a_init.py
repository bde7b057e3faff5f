"""One random A init for the LoRA family within a study.

LoRA, DoRA, rsLoRA, LoRA+ and LoRA-FA share the adapter W0 + s·BA with B0 = 0 and A0 drawn at random;
`kaiming` (peft's default, variance 1/(3n)) and `gaussian` (N(0, 1/n)) differ by √3 in A's scale. A study
that compares these methods with each other must draw A the same way for all of them, else every
method gap also carries that √3 (paper 002's Table 3 / Table 6 gaps are 0.2-4 points). The check: each
LoRA-family method of the study uses the same set of random inits (one set for all; a study that
compares inits themselves, e.g. an `init` axis crossed with a `method` axis, passes when every method
has every init). Cells with a structured init (pissa, milora, rlpo, ...) are init variants, not A draws:
they are left out.
"""

from __future__ import annotations

from typing import Any, Iterable

from lorarl.adapters.catalog import check_config
from lorarl.adapters.counts import LORA_FAMILY

RANDOM_A_INITS = ("kaiming", "gaussian")  # B0 = 0, A0 drawn at random


def random_a_inits(cells: Iterable[Any]) -> dict[str, dict[str, list[str]]]:
    """method -> random init -> ids of the study cells (lorarl.language.study.study_cells) that use it."""
    out: dict[str, dict[str, list[str]]] = {}
    for c in cells:
        adapter = getattr(c.config, "adapter", None)
        if adapter is None:  # a cell with no model adapter (the KL-bound toy)
            continue
        a = check_config(adapter.model_dump())
        if a["method"] in LORA_FAMILY and a["init"] in RANDOM_A_INITS:
            out.setdefault(a["method"], {}).setdefault(a["init"], []).append(c.id)
    return out


def mixed_a_init(cells: Iterable[Any]) -> str | None:
    """Why the study's LoRA-family methods do not share their random A init, or None when they do."""
    used = random_a_inits(cells)
    sets = {m: tuple(sorted(inits)) for m, inits in used.items()}
    if len(set(sets.values())) <= 1:
        return None
    parts = "; ".join(f"{m}: {', '.join(s)} ({', '.join(c for i in s for c in used[m][i])})"
                      for m, s in sets.items())
    return (f"LoRA-family methods draw A differently ({parts}); set one adapter.init (allowed: "
            f"{', '.join(RANDOM_A_INITS)}) on every LoRA-family cell of the study")
