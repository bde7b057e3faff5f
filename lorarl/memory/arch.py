"""Model dimensions for the memory plan: a local ``config.json`` when there is one, else the shipped table.

Where a model's dimensions come from, in order:

1. ``local:<recipe>``: the built model's ``results/models/<recipe>/config.json``, else the recipe itself
   (lorarl.models.RECIPES; its tokenizer is trained to ``VOCAB_LOCAL`` tokens);
2. a folder with a ``config.json``, or an HF id whose ``config.json`` is in the local HF cache (nothing
   is downloaded);
3. :data:`PUBLISHED`: the models the published studies name, each row the values of the model's
   ``config.json`` on the Hugging Face hub (the model card's "Files" tab), copied here so that a study can
   be planned on a machine with no network and no weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

VOCAB_LOCAL = 320  # lorarl.models.build_tokenizer's vocab_size: the local recipes' tokenizer


class PlanError(ValueError):
    """Bad input to the memory plan (unknown model, bad setting): `lorarl memory` exits 2."""


@dataclass(frozen=True)
class Arch:
    name: str  # what the plan calls it (HF id, recipe or path)
    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (GQA)
    intermediate: int  # intermediate_size (gated MLP: gate, up, down)
    vocab: int  # vocab_size (the lm_head's rows: the logits' width)
    tie_embeddings: bool  # tie_word_embeddings: lm_head shares the embedding matrix
    head_dim: int | None = None  # head_dim where the config sets it (Qwen3, Gemma 3); else hidden / heads
    source: str = ""  # where these numbers come from

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def linears(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of one decoder layer's linear modules (what all-linear adapters wrap)."""
        h, q, kv, i = self.hidden, self.heads * self.hd, self.kv_heads * self.hd, self.intermediate
        return [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h),
                ("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)]

    def params(self) -> int:
        """Parameters: embedding, layers (linears + two norms), final norm, lm_head unless tied."""
        per_layer = sum(a * b for _, a, b in self.linears()) + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden + head


def _row(name: str, hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tie: bool,
         head_dim: int | None = None) -> Arch:
    return Arch(name, hidden, layers, heads, kv, inter, vocab, tie, head_dim,
                f"https://huggingface.co/{name}/blob/main/config.json")


# hidden, layers, heads, kv heads, intermediate, vocab, tie_word_embeddings[, head_dim] as in config.json
PUBLISHED: dict[str, Arch] = {a.name: a for a in [
    _row("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1536, 28, 12, 2, 8960, 151936, False),
    _row("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 3584, 28, 28, 4, 18944, 152064, False),
    _row("Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, False),
    _row("Qwen/Qwen2.5-3B-Instruct", 2048, 36, 16, 2, 11008, 151936, True),
    _row("Qwen/Qwen3-1.7B-Base", 2048, 28, 16, 8, 6144, 151936, True, 128),
    _row("Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, 151936, False, 128),
    _row("meta-llama/Llama-3.2-3B-Instruct", 3072, 28, 24, 8, 8192, 128256, True),
    _row("google/gemma-3-1b-it", 1152, 26, 4, 1, 6912, 262144, True, 256),
    _row("peiyi9979/math-shepherd-mistral-7b-prm", 4096, 32, 32, 8, 14336, 32000, False),  # Mistral-7B-v0.1
]}


def from_config(name: str, cfg: dict, source: str) -> Arch:
    """An Arch from a transformers config.json dict (text config of a multimodal one)."""
    cfg = cfg.get("text_config", cfg)
    try:
        return Arch(name, int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"]),
                    int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]), int(cfg["intermediate_size"]),
                    int(cfg["vocab_size"]), bool(cfg.get("tie_word_embeddings", True)), cfg.get("head_dim"), source)
    except KeyError as err:
        raise PlanError(f"{source}: config.json has no {err.args[0]} (a decoder-only LM config is needed)") from None


def _cached_config(model: str) -> Path | None:
    """The HF cache's copy of ``<model>/config.json`` (offline; None if absent)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        got = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - not a repo id, no cache: the table decides
        return None
    return Path(got) if isinstance(got, str) else None


def arch_for(model: str, results_dir: str | Path = "results") -> Arch:
    """The dimensions of ``model`` (see the module docstring for the order)."""
    from lorarl.models import RECIPES, recipe_name, resolve_model

    recipe = recipe_name(model)
    if recipe is not None:
        if recipe not in RECIPES:
            raise PlanError(f"unknown local model recipe {recipe!r}; allowed: {', '.join(RECIPES)}")
        built = Path(resolve_model(model, results_dir)) / "config.json"
        if built.exists():
            return from_config(model, json.loads(built.read_text()), str(built))
        r = RECIPES[recipe]
        return Arch(model, r.hidden, r.layers, r.heads, r.kv_heads, r.intermediate, VOCAB_LOCAL, True, None,
                    f"lorarl.models.RECIPES[{recipe!r}] (not built yet)")
    local = Path(model) / "config.json"
    if local.exists():
        return from_config(model, json.loads(local.read_text()), str(local))
    cached = _cached_config(model)
    if cached is not None:
        return from_config(model, json.loads(cached.read_text()), str(cached))
    if model in PUBLISHED:
        return PUBLISHED[model]
    raise PlanError(f"model {model!r}: no local config.json (a folder, or the HF cache) and not in the shipped "
                    f"table; allowed: a local:<recipe>, a folder with config.json, a cached HF id, or one of "
                    f"{', '.join(PUBLISHED)}")
