"""Base models: tiny Qwen2-architecture LMs built and SFT-warm-started locally, or any HF id/path.

`model: local:<recipe>` in a cell config names a recipe below; the Snakemake `base` rule builds it into
`results/models/<recipe>/` (no download). Anything else is handed to `from_pretrained` unchanged.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lorarl.jobclock import first_work

LOCAL_PREFIX = "local:"



@dataclass(frozen=True)
class TinyRecipe:
    hidden: int = 128  # model width: ~1M parameters at 4 layers
    layers: int = 4  # depth
    heads: int = 4  # attention heads
    kv_heads: int = 2  # grouped-query KV heads, as in Qwen2
    intermediate: int = 256  # MLP width
    sft_steps: int = 800  # warm-start steps: sets base accuracy (~15-40% for the demo)
    sft_batch: int = 64  # SFT batch size
    sft_lr: float = 3e-3  # SFT learning rate (AdamW)
    task_seed: int = 1234  # synthetic split seed (must match the studies' task.seed)
    n_train: int = 20000  # SFT examples generated from the task's train distribution
    max_operands: int = 3  # longest chains seen during SFT
    max_value: int = 20  # operand range during SFT (must match the studies' task.max_value)
    p_unboxed: float = 0.5  # share of SFT solutions ending "answer: N" instead of \boxed{N}, like a real
    # base model's format habits: the outcome reward only pays boxed answers, so RL has a habit to fix
    seed: int = 0  # init + data order
    init_from: str | None = None  # continue SFT from this recipe's built model (its shape and tokenizer)


RECIPES: dict[str, TinyRecipe] = {
    "tiny-arith": TinyRecipe(),  # the demo base: weak but non-zero accuracy
    # The CPU twins' second, stronger model: tiny-arith SFT'd 300 more steps on boxed solutions only (the
    # lr restarts at 1e-3). The distillation teacher of reward_density_cpu (paper 001: an answer-producing
    # teacher stronger than the student; the paper's is also bigger, which did not fit a 2-core machine), the
    # stronger 7B rows (papers 002, 003) and paper 004's second model. Same shape and tokenizer as tiny-arith
    # (the teacher scores the student's token ids).
    "tiny-arith-boxed": TinyRecipe(init_from="tiny-arith", sft_steps=300, sft_lr=1e-3, p_unboxed=0.0),
    "tiny-test": TinyRecipe(hidden=32, layers=2, intermediate=64, sft_steps=30, sft_batch=16, n_train=500),
}


def recipe_hash(name: str) -> str:
    """Changes when a recipe changes, so the Snakemake base rule rebuilds the model."""
    import hashlib

    fields = asdict(RECIPES[name])
    if fields["init_from"] is None:  # recipes from scratch keep the hash they had before init_from existed
        del fields["init_from"]
    else:  # a continued recipe rebuilds when its parent does
        fields["init_from"] = [fields["init_from"], recipe_hash(fields["init_from"])]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def parent_recipe(name: str) -> str | None:
    """The recipe whose built model `name` continues from (None: built from scratch)."""
    return RECIPES[name].init_from


def cell_models(cfg: Any) -> list[str]:
    """The models of a cell that may be local recipes: its base model and the extra models of its reward
    regime that resolve `local:<recipe>` (a distillation teacher; lorarl.rewards.ExtraModel.local_recipe)."""
    from lorarl.rewards.registry import extra_models

    if not hasattr(cfg, "model"):
        return []  # another study kind's cell (the toy KL-bound study): no model at all
    return [cfg.model] + [x.model for x in extra_models(cfg.reward) if x.local_recipe and x.model]


def study_recipes(cells: list) -> list[str]:
    """The local recipes a study's cells need (their base models and distillation teachers), each after the
    recipe it continues (`init_from`)."""
    names: list[str] = []
    for c in cells:
        for model in cell_models(c.config):
            chain, name = [], recipe_name(model) if model else None
            while name and name not in names and name not in chain:
                chain.append(name)
                name = parent_recipe(name) if name in RECIPES else None
            names += reversed(chain)
    return names


def recipe_name(model: str) -> str | None:
    return model[len(LOCAL_PREFIX):] if model.startswith(LOCAL_PREFIX) else None


def resolve_model(model: str, results_dir: str | Path = "results") -> str:
    """`local:<recipe>` → its build folder; anything else is an HF id or path, returned as is."""
    name = recipe_name(model)
    if name is None:
        return model
    if name not in RECIPES:
        raise ValueError(f"unknown local model recipe {name!r}; allowed: {', '.join(RECIPES)}")
    return str(Path(results_dir) / "models" / name)


def build_tokenizer(texts: list[str], vocab_size: int = 320):
    """A Qwen2-style byte-level BPE (digits split one by one) trained locally with `tokenizers`.

    It is saved and re-loaded as a real `Qwen2Tokenizer`, so `AutoTokenizer` (TRL, vLLM, eval) sees
    exactly the pipeline it was trained with.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Qwen2Tokenizer(vocab=state["vocab"], merges=merges)
    tok.padding_side = "left"
    return tok


def build_tiny(recipe: TinyRecipe, vocab_size: int, eos_id: int, pad_id: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(recipe.seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=recipe.hidden, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        intermediate_size=recipe.intermediate, max_position_embeddings=256,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=eos_id, tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg)


def encode_sft(tok, examples: list[tuple[str, str]]):
    """Every example tokenized once (one batched call) and right-padded into one table: (ids_NL, labels_NL,
    lengths_N); labels are -100 on the prompt and the padding (the loss is on the completion + EOS only)."""
    import torch

    prompts = tok([p for p, _ in examples])["input_ids"]
    comps = tok([c for _, c in examples])["input_ids"]
    lengths = [len(p) + len(c) + 1 for p, c in zip(prompts, comps)]
    ids = torch.full((len(examples), max(lengths)), tok.pad_token_id)
    labels = torch.full((len(examples), max(lengths)), -100)
    for i, (p, c) in enumerate(zip(prompts, comps)):
        c = c + [tok.eos_token_id]
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
    return ids, labels, torch.tensor(lengths)


def sft(model, tok, examples: list[tuple[str, str]], recipe: TinyRecipe, progress: bool = True,
        on_step=None) -> list[float]:
    """Plain next-token SFT on the completion tokens only (prompt tokens masked); `on_step(i)` after step i.

    Each step draws `sft_batch` examples at random (the same draws as ever: `rng.sample` over the example
    indices) from a table tokenized once. Rows are right-padded, so no attention mask is needed: under the
    causal mask a real token never attends to the padding after it, and padding carries no loss."""
    import torch
    from tqdm import tqdm

    rng = random.Random(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / recipe.sft_steps))
    )
    ids_NL, labels_NL, len_N = encode_sft(tok, examples)
    model.train()
    losses = []
    first_work("SFT step")  # the job's start-up ends here (lorarl.jobclock)
    for i in tqdm(range(1, recipe.sft_steps + 1), desc="sft", disable=not progress, mininterval=5):
        idx_B = torch.tensor(rng.sample(range(len(len_N)), recipe.sft_batch))
        width = int(len_N[idx_B].max())
        loss = model(input_ids=ids_NL[idx_B, :width], labels=labels_NL[idx_B, :width]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        if on_step is not None:
            on_step(i)
    model.eval()
    return losses


def recipe_data_and_tokenizer(recipe: TinyRecipe):
    """The recipe's SFT problems and its tokenizer. The tokenizer corpus depends only on the data fields
    (task_seed, n_train, max_operands, max_value), not on the shape, p_unboxed or sft_steps: recipes that
    differ only there (the bigger distillation teacher) get the exact same tokenizer, which on-policy
    distillation requires (the teacher scores the student's token ids)."""
    from lorarl.tasks.synthetic import make_splits

    train, _ = make_splits(recipe.task_seed, recipe.n_train, 1, max_ops=recipe.max_operands,
                           max_value=recipe.max_value)
    corpus = [p.prompt + s for p in train for s in (p.solution, p.unboxed_solution)]
    return train, build_tokenizer(corpus + ["0123456789+-=?\nQA: \\boxed{}"])


def omp_wait_policy(load1: float | None = None, cores: int | None = None) -> str | None:
    """On a busy machine, idle OpenMP threads sleep instead of spinning (`OMP_WAIT_POLICY=PASSIVE`, read when
    torch loads: set before the build imports it; a value already set is kept). Measured on a 2-core machine
    (docs/benchmarks.md): beside one busy process an SFT step took 1.6x longer with the default spin-wait; on a
    quiet machine PASSIVE made it 1.2x longer. Busy: a 1-minute load average of at least the core count."""
    if "OMP_WAIT_POLICY" in os.environ:
        return os.environ["OMP_WAIT_POLICY"]
    load1 = os.getloadavg()[0] if load1 is None else load1
    if load1 >= (cores or os.cpu_count() or 1):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "PASSIVE"
    return None


def build_base(name: str, out_dir: str | Path, threads: int | None = None) -> dict:
    """Build tokenizer + tiny model for recipe `name`, SFT it, save with save_pretrained. The build's progress
    (phase, SFT step) goes to a small file that `lorarl status` reads (lorarl.build_progress)."""
    from lorarl.build_progress import BuildProgress

    omp_wait_policy()
    import torch

    if threads:
        torch.set_num_threads(threads)
    recipe = RECIPES[name]
    t0 = time.time()
    out = Path(out_dir)
    progress = BuildProgress(out, name, recipe.sft_steps)
    progress.phase("data")
    train, tok = recipe_data_and_tokenizer(recipe)
    pick = random.Random(recipe.seed + 1)
    examples = [(p.prompt, p.unboxed_solution if pick.random() < recipe.p_unboxed else p.solution) for p in train]
    if recipe.init_from:  # continue the parent's SFT: its weights and its (identical) tokenizer
        parent = out.parent / recipe.init_from
        if not (parent / "config.json").exists():
            raise FileNotFoundError(f"recipe {name!r} continues {recipe.init_from!r}, which is not built at {parent}: "
                                    f"build it first (the base rule does: snakemake {parent}/config.json)")
        model, tok = load_model_and_tokenizer(str(parent))
    else:
        model = build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    progress.phase("sft")
    losses = sft(model, tok, examples, recipe, on_step=progress.step)
    progress.phase("saving")
    tmp = out.with_name(out.name + ".tmp")
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    info = {"recipe": name, **asdict(recipe), "params": sum(p.numel() for p in model.parameters()),
            "final_sft_loss": sum(losses[-20:]) / 20, "build_seconds": round(time.time() - t0, 1)}
    (tmp / "lorarl_base.json").write_text(json.dumps(info, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    progress.path.unlink(missing_ok=True)  # built: `lorarl status` needs no progress for it any more
    return info


def load_model_and_tokenizer(path: str, dtype: str = "float32", device: str = "cpu"):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    return model, tok
