"""Evaluation backends: prompts, the tiny model for evaluation, its tokenizer."""

from __future__ import annotations

import torch


PROMPTS = ["Q: 12+7=?\nA: ", "Q: 3-1=?\nA: ", "Q: 45+45-9=?\nA: "]


def _tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("0123456789+-=?:QA \n\\boxed{}"))
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|pad|>", "<|unk|>"] + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", unk_token="<|unk|>", padding_side="left")


def save_eval_tiny(tmp_path_factory):
    """A saved tiny Qwen2 base, a LoRA adapter with non-zero B, and a DoRA adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("tiny")
    tok = _tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                      max_position_embeddings=128, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
                      tie_word_embeddings=True)
    base = Qwen2ForCausalLM(cfg)
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    paths = {"base": root / "base"}
    for name, extra in (("lora", {}), ("dora", {"use_dora": True})):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM.from_pretrained(root / "base")
        lcfg = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"],
                          init_lora_weights=False, **extra)   # random A and B: the adapter matters
        peft_model = get_peft_model(model, lcfg)
        with torch.no_grad():
            for n, p in peft_model.named_parameters():
                if "lora_B" in n:
                    p.mul_(4.0)
        peft_model.save_pretrained(root / name)
        paths[name] = root / name
    return paths
