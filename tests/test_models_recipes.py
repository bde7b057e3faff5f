"""Local model recipes: a recipe may continue another's SFT (`init_from`): the CPU twins' stronger model
(tiny-arith-boxed, also the distillation teacher) is tiny-arith's SFT continued on boxed answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lorarl import models
from lorarl.models import RECIPES, TinyRecipe, build_base, load_model_and_tokenizer, recipe_hash


def test_scratch_recipes_keep_their_hash():
    # the values before `init_from` existed: adding the field must not rebuild every model (and rerun every cell)
    assert recipe_hash("tiny-arith") == "78989ba75b"
    assert recipe_hash("tiny-test") == "3b91b9f584"


def test_continued_recipe_rebuilds_with_its_parent(monkeypatch):
    recipes = {"p": TinyRecipe(sft_steps=5), "c": TinyRecipe(init_from="p", sft_steps=3)}
    monkeypatch.setattr(models, "RECIPES", recipes)
    before = recipe_hash("c")
    recipes["p"] = replace(recipes["p"], sft_steps=6)
    assert recipe_hash("c") != before                      # the parent changed: the child is rebuilt too
    assert models.parent_recipe("c") == "p" and models.parent_recipe("p") is None


def test_continued_recipe_starts_from_the_parent_weights_and_tokenizer(tmp_path, monkeypatch):
    tiny = replace(RECIPES["tiny-test"], sft_steps=4, n_train=200, sft_lr=1.0)  # the parent moves far from its init
    recipes = {"parent": tiny,
               "still": replace(tiny, init_from="parent", sft_steps=2, sft_lr=1e-12, p_unboxed=0.0),
               "moved": replace(tiny, init_from="parent", sft_steps=2, sft_lr=1e-2, p_unboxed=0.0)}
    monkeypatch.setattr(models, "RECIPES", recipes)
    with pytest.raises(FileNotFoundError, match="continues 'parent'"):
        build_base("still", tmp_path / "models" / "still", threads=1)   # parent not built yet: clear error
    build_base("parent", tmp_path / "models" / "parent", threads=1)
    for name in ("still", "moved"):
        build_base(name, tmp_path / "models" / name, threads=1)
    (p, tok_p), (s, tok_s), (m, tok_m) = (load_model_and_tokenizer(str(tmp_path / "models" / n))
                                          for n in ("parent", "still", "moved"))
    assert tok_s.get_vocab() == tok_p.get_vocab() == tok_m.get_vocab()
    diff = {n: max((a - b).abs().max().item() for a, b in zip(p.parameters(), x.parameters()))
            for n, x in (("still", s), ("moved", m))}
    assert diff["still"] < 1e-6      # lr ~0: the parent's weights, not a fresh init
    assert diff["moved"] > 1e-4      # and the SFT really continues
    fresh = models.build_tiny(tiny, len(tok_p), tok_p.eos_token_id, tok_p.pad_token_id)  # the init "still" would have
    assert max((a - b).abs().max().item() for a, b in zip(p.parameters(), fresh.parameters())) > 1e-3
