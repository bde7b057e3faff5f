"""Paper 004's mask densities (Tables 4-5 "#params", linear layers only): the mask settings of
experiments/off_principal_masks*.yaml reproduce 50% / 50% / 58.59% on DeepSeek-R1-Distill-Qwen-1.5B's shapes
(lorarl.memory.arch.PUBLISHED: no download), the MASK DENSITY table of the study says so, and the union's 74.02%
is stated as a property of the weights, not of the shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from lorarl.adapters.catalog import check_config
from lorarl.adapters.inits import spectrum_of
from lorarl.adapters.masks import low_magnitude, make_mask, principal, shape_density
from lorarl.language.config import AdapterConfig
from lorarl.memory.arch import PUBLISHED
from lorarl.language.study import load_study, study_cells

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
MODEL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
TABLE4 = {"dense": "100%", "principal": "50%", "nonprincipal": "50%", "low_magnitude": "58.59%", "safe": "74.02%",
          "random": "74.02%"}  # paper 004 Table 4 (and Table 5) "#params"


def density_table(path: Path) -> dict[str, list[str]]:
    """The leading comments' MASK DENSITY table: mask -> [Table 4, lorarl, reason]."""
    block = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
    start = next(i for i, x in enumerate(block) if x.startswith("MASK DENSITY"))
    head = next(i for i in range(start, len(block)) if block[i].startswith("| mask |"))
    assert [c.strip() for c in block[head].strip("|").split("|")] == ["mask", "Table 4", "lorarl", "reason"]
    rows = {}
    for line in block[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _agrees(paper: str, ours: float) -> bool:
    decimals = len(paper.rstrip("%").partition(".")[2])
    return round(100 * ours, decimals) == float(paper.rstrip("%"))


def _shapes(model: str) -> list[tuple[int, int]]:
    arch = PUBLISHED[model]
    return [(o, i) for _, i, o in arch.linears()] * arch.layers


def _masks(study: str) -> dict[str, dict]:
    return {c.axes["mask"]: check_config(c.config.adapter.model_dump())
            for c in study_cells(load_study(EXPERIMENTS / f"{study}.yaml"))}


def test_the_study_reproduces_table4s_densities_on_the_published_shapes():
    rows = density_table(EXPERIMENTS / "off_principal_masks.yaml")
    masks = _masks("off_principal_masks")
    assert set(rows) == set(masks) == set(TABLE4)
    shapes = _shapes(MODEL)
    for label, applied in masks.items():
        paper, ours, reason = rows[label]
        assert paper == TABLE4[label], label
        if applied.get("mask") is None:
            assert ours == "100%"
            continue
        if applied["mask"] in ("safe", "random"):  # a union: its density depends on the weights
            assert ours == "weights" and ("overlap" in reason or "safe mask's density" in reason), label
            continue
        density = shape_density(applied["mask"], shapes, applied["mask_alpha"])
        assert _agrees(paper, density), f"{label}: Table 4 {paper}, lorarl trains {100 * density:.4f}%"
        assert ours == f"{100 * density:.2f}%", label


def test_the_union_masks_use_the_rows_own_parts_and_the_weights_decide_74_percent():
    masks = _masks("off_principal_masks")
    for union in ("safe", "random"):
        assert masks[union]["mask_alpha"] == masks["principal"]["mask_alpha"] == 0.5  # the non-principal 50%
        assert masks[union]["mask_low_alpha"] == masks["low_magnitude"]["mask_alpha"]   # the low-magnitude 58.59%
        assert masks[union]["mask_rank"] == masks["principal"]["mask_rank"]
    low, nonprincipal = 0.5859, 0.5
    independent = 1 - (1 - low) * (1 - nonprincipal)
    assert max(low, nonprincipal) < 0.7402 < independent  # 74.02% needs more overlap than chance: the weights'


@pytest.mark.parametrize("study", ["off_principal_masks", "off_principal_masks_cpu"])
def test_twin_and_study_share_the_mask_settings(study):
    assert _masks(study) == _masks("off_principal_masks")


def test_shape_density_is_what_make_mask_trains():
    gen = torch.Generator().manual_seed(0)
    shapes = [(12, 20), (7, 9), (30, 5)]
    for kind, alpha in (("principal", 0.5), ("nonprincipal", 0.5), ("low_magnitude", 0.5859)):
        trained = 0
        for m, n in shapes:
            W = torch.randn(m, n, generator=gen)
            mask = make_mask(kind, W, alpha=alpha, k=3, spectrum=spectrum_of(W, 4), gen=gen)
            trained += int(mask.sum())
        assert trained / sum(m * n for m, n in shapes) == shape_density(kind, shapes, alpha), kind
    with pytest.raises(ValueError, match="depends on the weights; allowed: principal, nonprincipal, low_magnitude"):
        shape_density("safe", shapes, 0.5)


def test_the_safe_mask_takes_its_low_magnitude_part_at_mask_low_alpha():
    gen = torch.Generator().manual_seed(1)
    W = torch.randn(40, 30, generator=gen)
    spec = spectrum_of(W, 4)
    safe = make_mask("safe", W, alpha=0.5, k=4, spectrum=spec, gen=gen, low_alpha=0.5859)
    assert torch.equal(safe, low_magnitude(W, 0.5859) | ~principal(W, spec, 4, 0.5))
    assert not torch.equal(safe, make_mask("safe", W, alpha=0.5, k=4, spectrum=spec, gen=gen))  # null: alpha


def test_mask_low_alpha_applies_to_the_union_masks_only():
    assert AdapterConfig(method="full", mask="random", mask_low_alpha=0.6).mask_low_alpha == 0.6
    with pytest.raises(ValidationError, match=r"adapter.mask_low_alpha=0.6 does not apply to method 'full'"):
        AdapterConfig(method="full", mask="low_magnitude", mask_low_alpha=0.6)
    with pytest.raises(ValidationError, match="mask_low_alpha"):
        AdapterConfig(method="full", mask="safe", mask_low_alpha=1.0)
