"""The names vLLM 0.31.0 accepts (read from its wheel: vllm/entrypoints/llm.py, vllm/engine/arg_utils.py,
vllm/sampling_params.py, vllm/config/lora.py, vllm/config/model.py), for tests/support/fake_vllm.py."""

LLM_PARAMS = frozenset({  # vllm.LLM.__init__ named parameters (0.31.0)
    "runner", "convert", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "allowed_local_media_path", "allowed_media_domains", "tensor_parallel_size", "dtype", "quantization",
    "revision", "tokenizer_revision", "chat_template", "seed", "gpu_memory_utilization", "cpu_offload_gb",
    "offload_group_size", "offload_num_in_group", "offload_prefetch_step", "offload_params", "enforce_eager",
    "enable_return_routed_experts", "return_sampling_mask", "disable_custom_all_reduce", "hf_token",
    "hf_overrides", "mm_processor_kwargs", "pooler_config", "structured_outputs_config", "profiler_config",
    "attention_config", "kv_cache_memory_bytes", "compilation_config", "quantization_config",
    "logits_processors", "spec_method", "spec_model", "spec_tokens",
})
ENGINE_ARGS = frozenset({  # EngineArgs fields (0.31.0) that TRL 1.16 or lorarl pass through **kwargs
    "max_model_len", "max_num_seqs", "enable_sleep_mode", "distributed_executor_backend",
    "max_num_batched_tokens", "logprobs_mode", "model_impl", "enable_lora", "max_loras", "max_lora_rank",
    "disable_log_stats", "enable_prefix_caching", "max_cpu_loras",
})
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py MaxLoRARanks
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
SAMPLING_FIELDS = frozenset({  # vllm.SamplingParams public fields (0.31.0)
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "watermarking", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
    "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids", "flat_logprobs",
    "detokenize", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "output_kind", "stream_interval", "skip_clone", "output_text_buffer_length", "structured_outputs",
    "logit_bias", "allowed_token_ids", "extra_args", "bad_words", "skip_reading_prefix_cache",
    "thinking_token_budget", "repetition_detection", "routed_experts_prompt_start", "trace_decode_token_ids",
})
