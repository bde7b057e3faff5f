"""Generation backends.  :class:`HFBackend` runs transformers ``generate`` with left-padded batches
on CPU or GPU, optionally with a peft adapter (merged into the weights or kept separate).

Every backend has the same interface::

    backend.generate(prompts, protocol, seed) -> list[list[Completion]]   # n per prompt

Decoding follows the protocol only: a fresh ``GenerationConfig`` is built for every call, so a
model's own ``generation_config.json`` (top-k, repetition penalty, ...) never leaks into the
numbers.  torch / transformers / peft are imported lazily.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from lorarl.grading.protocols import Protocol
from lorarl.stop_ids import stop_token_ids

__all__ = ["Completion", "HFBackend", "merge_adapter", "completions_from_ids", "format_prompt", "length_batches",
           "padding_tokens"]


@dataclass(frozen=True)
class Completion:
    """One generated completion: decoded text (special tokens dropped), generated tokens counted
    up to and including the end-of-sequence token, and whether the budget ran out first."""

    text: str
    n_tokens: int
    truncated: bool


def completions_from_ids(rows: Iterable[Sequence[int]], tokenizer: Any, eos_ids: Sequence[int]
                         ) -> list[Completion]:
    """Turn generated token rows (prompt removed) into completions; text stops at the first EOS."""
    eos = set(eos_ids)
    out = []
    for row in rows:
        ids = list(row)
        stop = next((j for j, t in enumerate(ids) if t in eos), None)
        if stop is None:
            # no EOS: generate() pads only after an EOS, so every token here was generated
            out.append(Completion(tokenizer.decode(ids, skip_special_tokens=True), len(ids), True))
        else:
            out.append(Completion(tokenizer.decode(ids[:stop], skip_special_tokens=True), stop + 1,
                                  False))
    return out


def format_prompt(tokenizer: Any, prompt: str, use_chat_template: bool | None) -> tuple[str, bool]:
    """The text fed to the model and whether it already holds the special tokens.

    ``use_chat_template=None`` means: use the tokenizer's chat template when it has one.
    """
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template or (use_chat_template is None and has_template):
        if not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return text, True
    return prompt, False


def length_batches(lengths: Sequence[int], n: int, batch_size: int, by_length: bool = True
                   ) -> list[list[tuple[int, int]]]:
    """The ``generate`` calls of one evaluation: (prompt index, sample index) jobs, ``batch_size`` per call.

    ``by_length``: longest prompts first (ties in prompt order), so each batch holds prompts of similar length and
    its left padding is small; False: prompt order (the reference). The caller restores prompt order."""
    jobs = [(i, s) for i in range(len(lengths)) for s in range(n)]
    if by_length:
        jobs.sort(key=lambda j: (-lengths[j[0]], j))
    return [jobs[k:k + batch_size] for k in range(0, len(jobs), batch_size)]


def padding_tokens(lengths: Sequence[int], batches: Sequence[Sequence[tuple[int, int]]]) -> list[int]:
    """Pad tokens of each batch's prompts (left padding to the batch's longest prompt)."""
    out = []
    for chunk in batches:
        width = max(lengths[i] for i, _ in chunk)
        out.append(sum(width - lengths[i] for i, _ in chunk))
    return out


def plain_prompt_config(use_chat_template: bool | None = None) -> Any:
    """A PromptConfig with no system prompt and the old ``use_chat_template`` switch (None = auto)."""
    from lorarl.language.prompt import PromptConfig

    return PromptConfig(chat_template={True: "on", False: "off", None: "auto"}[use_chat_template])


def merge_adapter(base_path: str | Path, adapter_path: str | Path, out_dir: str | Path,
                  dtype: str = "auto") -> Path:
    """Merge a peft adapter into its base model and save model + tokenizer to ``out_dir`` (on CPU).

    Works for every peft method that implements ``merge_and_unload`` (LoRA, DoRA, rsLoRA, AdaLoRA,
    VeRA, IA3, ...): this is how methods a server cannot apply at run time are served.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, str(adapter_path)).merge_and_unload()
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(base_path)).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class HFBackend:
    """transformers ``generate`` with left-padded batching; optional peft adapter.

    ``merge=True`` folds the adapter into the weights (``merge_and_unload``); ``False`` keeps the
    peft wrapper (slower, but exactly what was trained).  ``batch_size`` counts sequences (prompts
    x samples) per ``generate`` call and changes memory use only.  Batches are bucketed by prompt
    length (:func:`length_batches`: longest first, so little padding) and the completions come back
    in prompt order: greedy completions are the same per prompt whatever the batching in float32 (checked
    against one prompt per call and prompt-order batches; in bfloat16 padding can move a logit by
    rounding); sampling draws from one generator seeded once per
    call, so sampled outputs for a seed are reproducible for the same prompts and batch size but
    change with the batches' composition.  ``by_length=False``: batches in prompt order (the reference
    the bucketing is measured against).  ``last_padding``: pad tokens of each batch of the last call.
    """

    def __init__(self, model_path: str | Path, adapter_path: str | Path | None = None, *,
                 merge: bool = False, device: str | None = None, dtype: str = "auto",
                 batch_size: int = 16, use_chat_template: bool | None = None,
                 prompt_config: Any = None, generation: Any = None, by_length: bool = True) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch_dtype)
        # keep only the special-token ids of the model's generation defaults: since transformers 5
        # its other fields (top-k, repetition penalty, ...) would fill whatever a call leaves unset
        src = model.generation_config
        eos = list(stop_token_ids(model, self.tokenizer))  # TRL's rule, as training stops (lorarl.stop_ids)
        model.generation_config = GenerationConfig(eos_token_id=eos[0] if len(eos) == 1 else eos,
                                                   bos_token_id=src.bos_token_id,
                                                   pad_token_id=self.tokenizer.pad_token_id)
        if adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_path))
            if merge:
                model = model.merge_and_unload()
        self.model = model.to(self.device).eval()
        self.batch_size = batch_size
        self.by_length = by_length
        self.last_padding: list[int] = []
        self.prompt_config = prompt_config if prompt_config is not None else plain_prompt_config(use_chat_template)
        self.eos_ids: list[int] = eos
        self.generation = generation  # runtime.generation: KV cache and compiled decode step (lorarl.decoding)

    def _generation_config(self, protocol: Protocol) -> Any:
        from transformers import GenerationConfig

        common = dict(max_new_tokens=protocol.max_new_tokens, eos_token_id=self.eos_ids,
                      pad_token_id=self.tokenizer.pad_token_id)
        if protocol.kind == "greedy":
            return GenerationConfig(do_sample=False, num_beams=1, **common)
        return GenerationConfig(do_sample=True, temperature=protocol.temperature,
                                top_p=protocol.top_p, top_k=0, min_p=None, typical_p=1.0,
                                repetition_penalty=1.0, **common)

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """Input ids of each user message: the cell's prompt (system, chat template) exactly as the
        train stage tokenises it (:func:`lorarl.tasks.prompt.prompt_ids`)."""
        from lorarl.tasks.prompt import build_prompt, prompt_ids

        return [prompt_ids(self.tokenizer, build_prompt(self.prompt_config, p, self.tokenizer), self.prompt_config) for p in prompts]

    def generate(self, prompts: Sequence[str], protocol: Protocol, seed: int = 0
                 ) -> list[list[Completion]]:
        """``protocol.n`` completions for each prompt (a user message), in prompt order."""
        import torch

        from lorarl.decoding import apply, plan

        dev = torch.device(self.device).type
        gen_cfg = apply(self._generation_config(protocol), plan(self.generation, self.model, dev), dev)
        ids = self.encode(prompts)
        lengths = [len(r) for r in ids]
        batches = length_batches(lengths, protocol.n, self.batch_size, self.by_length)
        self.last_padding = padding_tokens(lengths, batches)
        results: dict[tuple[int, int], Completion] = {}
        torch.manual_seed(seed)
        pad = self.tokenizer.pad_token_id
        for chunk in batches:
            rows = [ids[i] for i, _ in chunk]
            width = max(len(r) for r in rows)  # left padding, as the tokenizer pads for generation
            input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
            attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
            with torch.inference_mode():
                out = self.model.generate(input_ids=input_ids, attention_mask=attn, generation_config=gen_cfg)
            new = out[:, width:].tolist()
            comps = completions_from_ids(new, self.tokenizer, self.eos_ids)
            results.update(zip(chunk, comps))
        return [[results[(i, s)] for s in range(protocol.n)] for i in range(len(prompts))]
